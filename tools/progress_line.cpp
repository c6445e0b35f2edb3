#include "tools/progress_line.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace cairn::tool {

ProgressMode choose_progress_mode(bool quiet, bool force, bool stderr_is_tty) {
  if (quiet) return ProgressMode::kOff;
  if (stderr_is_tty) return ProgressMode::kTerminal;
  return force ? ProgressMode::kLines : ProgressMode::kOff;
}

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string human_duration(double seconds) {
  char buf[32];
  if (!(seconds >= 0)) seconds = 0;
  if (seconds < 10) {
    std::snprintf(buf, sizeof buf, "%.1fs", seconds);
  } else if (seconds < 60) {
    std::snprintf(buf, sizeof buf, "%.0fs", std::floor(seconds));
  } else if (seconds < 3600) {
    auto s = static_cast<long long>(seconds);
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  } else {
    auto m = static_cast<long long>(seconds / 60);
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", m / 60, m % 60);
  }
  return buf;
}

namespace {
double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

ProgressLine::ProgressLine(std::string label, ProgressMode mode, std::FILE* out, Clock clock)
    : label_(std::move(label)), mode_(mode), out_(out), clock_(clock ? std::move(clock) : Clock(steady_seconds)) {
  start_ = phase_start_ = clock_();
}

ProgressLine::~ProgressLine() {
  if (!finished_) abandon();
}

std::string ProgressLine::amount(uint64_t n) const {
  if (state_.unit == ProgressUnit::kBytes) return human_bytes(n);
  return std::to_string(n);
}

void ProgressLine::update(const ProgressSnapshot& s) {
  if (finished_ || mode_ == ProgressMode::kOff) return;
  const double now = clock_();
  const bool new_phase = !have_state_ || s.phase != state_.phase || s.unit != state_.unit;
  if (new_phase) phase_start_ = now;
  state_ = s;
  have_state_ = true;
  const double interval = mode_ == ProgressMode::kTerminal ? kTerminalInterval : kLinesInterval;
  if (!new_phase && last_draw_ >= 0 && now - last_draw_ < interval) return;
  if (mode_ == ProgressMode::kLines && last_draw_ >= 0 && state_ == drawn_) return;
  draw(now);
}

void ProgressLine::update_bytes(uint64_t done, uint64_t total) {
  ProgressSnapshot s = state_;
  s.unit = ProgressUnit::kBytes;
  s.done = done;
  s.total = total;
  update(s);
}

std::string ProgressLine::render() const {
  const double now = clock_();
  std::string out = label_ + ": ";
  if (state_.total == 0 && state_.done == 0) {
    // Nothing counted (yet): the step and how long the whole run has taken.
    return out + (state_.phase.empty() ? std::string("working") : state_.phase) + " (" + human_duration(now - start_) +
           ")";
  }
  if (!state_.phase.empty()) out += state_.phase + ": ";
  out += amount(state_.done);
  if (state_.total > 0) {
    out += " / " + amount(state_.total);
    char pct[16];
    std::snprintf(pct, sizeof pct, " (%.0f%%)",
                  100.0 * static_cast<double>(std::min(state_.done, state_.total)) / static_cast<double>(state_.total));
    out += pct;
  } else if (state_.unit == ProgressUnit::kItems) {
    out += " done";
  }
  const double elapsed = now - phase_start_;
  if (elapsed >= 0.2 && state_.done > 0) {
    const double rate = static_cast<double>(state_.done) / elapsed;
    if (state_.unit == ProgressUnit::kBytes) {
      out += "  " + human_bytes(static_cast<uint64_t>(rate)) + "/s";
    } else {
      char r[32];
      std::snprintf(r, sizeof r, "  %.1f/s", rate);
      out += r;
    }
    if (state_.total > state_.done)
      out += "  " + human_duration(static_cast<double>(state_.total - state_.done) / rate) + " left";
  }
  return out;
}

std::string ProgressLine::default_summary() const {
  const double elapsed = clock_() - start_;
  std::string out = label_ + ": " + amount(state_.done) + " in " + human_duration(elapsed);
  if (elapsed > 0 && state_.done > 0 && state_.unit == ProgressUnit::kBytes)
    out += " (" + human_bytes(static_cast<uint64_t>(static_cast<double>(state_.done) / elapsed)) + "/s)";
  return out;
}

void ProgressLine::draw(double now) {
  last_draw_ = now;
  drawn_ = state_;
  const std::string text = render();
  if (mode_ == ProgressMode::kTerminal) {
    std::fprintf(out_, "\r%s\x1b[K", text.c_str());
    line_open_ = true;
  } else {
    std::fprintf(out_, "%s\n", text.c_str());
  }
  std::fflush(out_);
  ++lines_;
}

void ProgressLine::finish(const std::string& summary) {
  if (finished_) return;
  finished_ = true;
  if (mode_ == ProgressMode::kOff) return;
  const std::string text = summary.empty() ? default_summary() : summary;
  std::fprintf(out_, "%s%s\n", line_open_ ? "\r\x1b[K" : "", text.c_str());
  std::fflush(out_);
  line_open_ = false;
  ++lines_;
}

void ProgressLine::abandon() {
  if (finished_) return;
  finished_ = true;
  if (line_open_) {
    std::fputs("\r\x1b[K", out_);
    std::fflush(out_);
  }
  line_open_ = false;
}

}  // namespace cairn::tool
