# The Tcl package `cairn` for Swift/T leaf functions (cairn.swift). Turbine finds it through
# `swift-t -r <this dir>` (or SWIFT_PATH / TURBINE_USER_LIB); libtclcairn.so finds libcairn.so in
# the lib directory two levels up (its RPATH).
package ifneeded cairn 0.1 [ list load [ file join $dir libtclcairn.so ] Tclcairn ]
