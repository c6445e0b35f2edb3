// One updating progress line on stderr for the `cairn` tool's long commands.
//
// On a terminal the line is redrawn in place (carriage return, clear to the end of the line) at most
// ten times a second; in lines mode (--progress on a pipe) each update is a plain line of its own,
// at most four a second and only when something changed, so that logs stay readable; off, nothing
// is printed. A new phase is drawn at once in either mode. finish() prints a one-line summary in either mode.
//
// Thread-safety: none; one thread (or one at a time) updates a ProgressLine.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

#include "core/progress.hpp"

namespace cairn::tool {

enum class ProgressMode { kOff, kTerminal, kLines };

// --quiet wins; --progress forces progress (in place on a terminal, lines elsewhere); otherwise
// progress only when stderr is a terminal.
ProgressMode choose_progress_mode(bool quiet, bool force, bool stderr_is_tty);

// 1023 B, 1.5 KiB, 20.0 MiB, ... (binary units).
std::string human_bytes(uint64_t bytes);
// 0.4s, 12s, 3m05s, 2h01m.
std::string human_duration(double seconds);

class ProgressLine {
 public:
  using Clock = std::function<double()>;  // seconds on a monotonic clock
  static constexpr double kTerminalInterval = 0.1;
  static constexpr double kLinesInterval = 0.25;

  // label: what the line is about ("import m1"). out: where it goes (stderr in the tool).
  ProgressLine(std::string label, ProgressMode mode, std::FILE* out, Clock clock = {});
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  // An unfinished line on a terminal is cleared.
  ~ProgressLine();

  ProgressMode mode() const { return mode_; }
  bool enabled() const { return mode_ != ProgressMode::kOff; }

  // The new state; drawn when the interval since the last draw has passed, and at once when it
  // starts a new phase (the first update does), which also restarts the rate and the time left.
  void update(const ProgressSnapshot& s);
  // Bytes done out of total (0: unknown) in the current phase.
  void update_bytes(uint64_t done, uint64_t total);

  // The summary on a line of its own (on a terminal, in place of the progress line); "" prints
  // default_summary(). Nothing when off. Later updates are ignored.
  void finish(const std::string& summary = "");
  // On a terminal, clears the progress line; prints nothing else (the error follows).
  void abandon();

  // "LABEL: [PHASE: ]DONE / TOTAL (P%)  RATE/s  T left", the parts not known yet left out.
  std::string render() const;
  // "LABEL: DONE in T (RATE/s)" over the whole run (the last phase's unit).
  std::string default_summary() const;
  // Seconds since the line was made.
  double elapsed() const { return clock_() - start_; }
  // Lines written so far (updates and the summary).
  int lines_written() const { return lines_; }

 private:
  std::string amount(uint64_t n) const;
  void draw(double now);

  std::string label_;
  ProgressMode mode_;
  std::FILE* out_;
  Clock clock_;
  double start_ = 0;
  double phase_start_ = 0;
  double last_draw_ = -1;
  ProgressSnapshot state_;
  ProgressSnapshot drawn_;
  bool have_state_ = false;
  bool line_open_ = false;  // a terminal line without its newline yet
  bool finished_ = false;
  int lines_ = 0;
};

}  // namespace cairn::tool
