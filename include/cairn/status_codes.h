/* cairn — the one list of status codes.
 *
 * Each entry is X(C_NAME, CppName, "message"). The C enum (cairn.h), the C++ enum
 * (cairn::StatusCode) and the message table (cairn_status_string) are all generated from this
 * list, so they cannot drift apart. Append only: the numeric values are part of the ABI. */
#ifndef CAIRN_STATUS_CODES_H
#define CAIRN_STATUS_CODES_H

#define CAIRN_STATUS_LIST(X)                                          \
  X(CAIRN_OK, kOk, "ok")                                              \
  X(CAIRN_ERR_NOT_FOUND, kNotFound, "not found")                      \
  X(CAIRN_ERR_EXISTS, kExists, "already exists")                      \
  X(CAIRN_ERR_INVALID_ARGUMENT, kInvalidArgument, "invalid argument") \
  X(CAIRN_ERR_NO_SPACE, kNoSpace, "no space left")                    \
  X(CAIRN_ERR_CORRUPTION, kCorruption, "corrupt data")                \
  X(CAIRN_ERR_IO, kIo, "I/O error")                                   \
  X(CAIRN_ERR_UNAVAILABLE, kUnavailable, "daemon unavailable")        \
  X(CAIRN_ERR_TIMEOUT, kTimeout, "timed out")                         \
  X(CAIRN_ERR_PERMISSION, kPermission, "permission denied")           \
  X(CAIRN_ERR_BUSY, kBusy, "busy")                                    \
  X(CAIRN_ERR_INTERNAL, kInternal, "internal error")                  \
  X(CAIRN_ERR_PROTOCOL, kProtocol, "protocol error")

#endif /* CAIRN_STATUS_CODES_H */
