// `cairn lineage ID --svg FILE` / `--png FILE`: a lineage tree drawn with Graphviz's library (libgvc,
// the dot layout), so a picture needs no other program.
#pragma once

#include <string>

#include "core/status.hpp"

namespace cairn::tool {

// Whether this build of the tool links Graphviz (CAIRN_WITH_GRAPHVIZ; Debian: libgraphviz-dev).
bool graphviz_linked();

// Lays out the Graphviz digraph `dot` and writes it to `path` as `format` ("svg" or "png"): to a
// temporary file beside it, renamed into place, so `path` is the whole picture or untouched.
// kInvalidArgument for another format or DOT that Graphviz cannot read (with its message);
// kUnavailable when the tool was built without Graphviz; kIo when the file cannot be written.
Status render_dot(const std::string& dot, const std::string& format, const std::string& path);

}  // namespace cairn::tool
