#include "core/status.hpp"

#include <cerrno>
#include <cstring>

#include "cairn/cairn.h"

namespace cairn {

#define CAIRN_STATUS_CHECK_(c_name, cpp_name, message) \
  static_assert(static_cast<int>(StatusCode::cpp_name) == static_cast<int>(c_name));
CAIRN_STATUS_LIST(CAIRN_STATUS_CHECK_)
#undef CAIRN_STATUS_CHECK_

namespace {
#define CAIRN_STATUS_MESSAGE_(c_name, cpp_name, message) message,
constexpr const char* kMessages[] = {CAIRN_STATUS_LIST(CAIRN_STATUS_MESSAGE_)};
#undef CAIRN_STATUS_MESSAGE_
constexpr int kCodeCount = static_cast<int>(sizeof(kMessages) / sizeof(kMessages[0]));
#define CAIRN_STATUS_NAME_(c_name, cpp_name, message) #c_name,
constexpr const char* kNames[] = {CAIRN_STATUS_LIST(CAIRN_STATUS_NAME_)};
#undef CAIRN_STATUS_NAME_
}  // namespace

const char* status_code_name(int value) { return value >= 0 && value < kCodeCount ? kNames[value] : nullptr; }

const char* status_code_string(StatusCode code) {
  int i = static_cast<int>(code);
  if (i < 0 || i >= kCodeCount) return "unknown status";
  return kMessages[i];
}

StatusCode status_code_from_int(int value) {
  if (value < 0 || value >= kCodeCount) return StatusCode::kInternal;
  return static_cast<StatusCode>(value);
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) rep_ = std::make_shared<const Rep>(Rep{code, std::move(message)});
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::to_string() const {
  if (!rep_) return "ok";
  std::string s = status_code_string(rep_->code);
  if (!rep_->message.empty()) {
    s += ": ";
    s += rep_->message;
  }
  return s;
}

Status Status::with_context(std::string_view context) const {
  if (!rep_) return *this;
  return Status(rep_->code, std::string(context) + ": " + rep_->message);
}

Status errno_status(std::string_view what, int err) {
  std::string m = std::string(what) + ": " + std::strerror(err);
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return no_space(m);
    case EACCES:
    case EPERM:
      return permission_denied(m);
    case ENOENT:
      return not_found(m);
    default:
      return io_error(m);
  }
}

}  // namespace cairn
