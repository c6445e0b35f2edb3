// Status and Result<T>: errors are values.
//
// Status holds a code (from the one list in include/cairn/status_codes.h) and a message that names
// the thing that went wrong and what to do. The success path allocates nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "cairn/status_codes.h"

namespace cairn {

#define CAIRN_STATUS_CPP_ENUM_(c_name, cpp_name, message) cpp_name,
enum class StatusCode : int { CAIRN_STATUS_LIST(CAIRN_STATUS_CPP_ENUM_) };
#undef CAIRN_STATUS_CPP_ENUM_

// The short text for a code ("not found"). Never null.
const char* status_code_string(StatusCode code);
// The C name of the code with that numeric value ("CAIRN_ERR_NOT_FOUND"); null for unknown values.
const char* status_code_name(int value);
// The code with that numeric value (as sent on the wire); kInternal for unknown values.
StatusCode status_code_from_int(int value);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status OK() { return Status(); }
  bool ok() const { return rep_ == nullptr; }
  explicit operator bool() const { return ok(); }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // The message alone ("" for OK).
  const std::string& message() const;
  // "not found: model 'x' is not in the repository".
  std::string to_string() const;
  // Prefixes context: "reading pack p: " + message.
  Status with_context(std::string_view context) const;

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;
};

// Shorthands: cairn::not_found("model 'x' ...").
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status already_exists(std::string m) { return {StatusCode::kExists, std::move(m)}; }
inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status no_space(std::string m) { return {StatusCode::kNoSpace, std::move(m)}; }
inline Status corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::kIo, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status timed_out(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
inline Status permission_denied(std::string m) { return {StatusCode::kPermission, std::move(m)}; }
inline Status busy(std::string m) { return {StatusCode::kBusy, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status protocol_error(std::string m) { return {StatusCode::kProtocol, std::move(m)}; }
// An I/O error from errno: "what: strerror(errno)". Maps ENOSPC to kNoSpace, EACCES to kPermission.
Status errno_status(std::string_view what, int err);

// A value or a Status. REQUIRES: never constructed from an OK status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<1>(v_);
  }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  T& operator*() & { return std::get<0>(v_); }
  const T& operator*() const& { return std::get<0>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace cairn

// Returns the status from the enclosing function if it is not OK.
#define CAIRN_RETURN_IF_ERROR(expr)                        \
  do {                                                     \
    ::cairn::Status cairn_status_tmp_ = (expr);            \
    if (!cairn_status_tmp_.ok()) return cairn_status_tmp_; \
  } while (0)

#define CAIRN_CONCAT_INNER_(a, b) a##b
#define CAIRN_CONCAT_(a, b) CAIRN_CONCAT_INNER_(a, b)
// CAIRN_ASSIGN_OR_RETURN(auto x, f()); — declares x from a Result, or returns its status.
#define CAIRN_ASSIGN_OR_RETURN(lhs, expr) \
  CAIRN_ASSIGN_OR_RETURN_IMPL_(CAIRN_CONCAT_(cairn_result_, __LINE__), lhs, expr)
#define CAIRN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
