#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tools/progress_line.hpp"

using cairn::ProgressSnapshot;
using cairn::ProgressUnit;
using namespace cairn::tool;

namespace {

// What a ProgressLine writes, through open_memstream.
struct Captured {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  ~Captured() {
    if (f) std::fclose(f);
    std::free(buf);
  }
  std::string text() {
    std::fflush(f);
    return std::string(buf, len);
  }
};

constexpr uint64_t kMiB = 1ull << 20;

}  // namespace

TEST_CASE("human units for bytes and durations", "[tools][progress]") {
  CHECK(human_bytes(0) == "0 B");
  CHECK(human_bytes(1023) == "1023 B");
  CHECK(human_bytes(1536) == "1.5 KiB");
  CHECK(human_bytes(300 * kMiB) == "300.0 MiB");
  CHECK(human_bytes(5ull << 40) == "5.0 TiB");
  CHECK(human_duration(0.42) == "0.4s");
  CHECK(human_duration(12.7) == "12s");
  CHECK(human_duration(185) == "3m05s");
  CHECK(human_duration(2 * 3600 + 60 + 5) == "2h01m");
}

TEST_CASE("the mode follows the terminal, --progress and --quiet", "[tools][progress]") {
  CHECK(choose_progress_mode(false, false, true) == ProgressMode::kTerminal);
  CHECK(choose_progress_mode(false, false, false) == ProgressMode::kOff);
  CHECK(choose_progress_mode(false, true, false) == ProgressMode::kLines);
  CHECK(choose_progress_mode(false, true, true) == ProgressMode::kTerminal);
  CHECK(choose_progress_mode(true, true, true) == ProgressMode::kOff);
  CHECK(choose_progress_mode(true, false, true) == ProgressMode::kOff);
}

TEST_CASE("rendering shows done, total, percent, rate and time left", "[tools][progress]") {
  double now = 100;
  Captured out;
  ProgressLine line("import m1", ProgressMode::kLines, out.f, [&] { return now; });
  now = 102;  // 2 s after the start, 100 MiB of 300 MiB: 50 MiB/s, 4 s left
  line.update(ProgressSnapshot{"", ProgressUnit::kBytes, 100 * kMiB, 300 * kMiB});
  // The phase started with the first update; the rate counts from there.
  CHECK(line.render() == "import m1: 100.0 MiB / 300.0 MiB (33%)");
  now = 104;
  line.update(ProgressSnapshot{"", ProgressUnit::kBytes, 200 * kMiB, 300 * kMiB});
  CHECK(line.render() == "import m1: 200.0 MiB / 300.0 MiB (67%)  100.0 MiB/s  1.0s left");
  ProgressSnapshot items{"verifying chunks", ProgressUnit::kItems, 3, 0};
  line.update(items);
  now = 106;
  CHECK(line.render() == "import m1: verifying chunks: 3 done  1.5/s");
}

TEST_CASE("terminal mode redraws in place at most ten times a second", "[tools][progress]") {
  double now = 0;
  Captured out;
  ProgressLine line("get m1", ProgressMode::kTerminal, out.f, [&] { return now; });
  for (int i = 1; i <= 128; ++i) {  // 128 updates over one second
    now = i / 128.0;
    line.update_bytes(static_cast<uint64_t>(i) * 100 * kMiB / 128, 100 * kMiB);
  }
  // The first at once, then one per 0.1 s.
  CHECK(line.lines_written() >= 9);
  CHECK(line.lines_written() <= 11);
  line.finish();
  const std::string text = out.text();
  CHECK(text.find('\r') == 0);
  CHECK(text.find("\x1b[K") != std::string::npos);
  // One newline only: the summary's, which replaces the progress line.
  CHECK(std::count(text.begin(), text.end(), '\n') == 1);
  CHECK(text.substr(text.rfind('\r')) == "\r\x1b[Kget m1: 100.0 MiB in 1.0s (100.0 MiB/s)\n");
}

TEST_CASE("lines mode writes plain lines, slower, and only when something changed", "[tools][progress]") {
  double now = 0;
  Captured out;
  ProgressLine line("fsck", ProgressMode::kLines, out.f, [&] { return now; });
  for (int i = 0; i <= 64; ++i) {  // one second of updates
    now = i / 64.0;
    line.update(ProgressSnapshot{"verifying chunks", ProgressUnit::kBytes, static_cast<uint64_t>(i) * 100 * kMiB / 64,
                                 100 * kMiB});
  }
  CHECK(line.lines_written() == 5);  // at 0, 0.25, 0.5, 0.75, 1.0
  for (int i = 0; i < 100; ++i) {    // the same state for ten more seconds: nothing new to say
    now += 0.1;
    line.update(ProgressSnapshot{"verifying chunks", ProgressUnit::kBytes, 100 * kMiB, 100 * kMiB});
  }
  CHECK(line.lines_written() == 5);
  now += 0.01;  // a new phase is shown at once, whatever the interval
  line.update(ProgressSnapshot{"scanning packs for orphans", ProgressUnit::kItems, 0, 4});
  CHECK(line.lines_written() == 6);
  line.finish("fsck: done");
  const std::string text = out.text();
  CHECK(text.find('\r') == std::string::npos);
  CHECK(text.find('\x1b') == std::string::npos);
  CHECK(std::count(text.begin(), text.end(), '\n') == 7);
  CHECK(text.find("fsck: scanning packs for orphans: 0 / 4 (0%)\n") != std::string::npos);
  CHECK(text.substr(0, text.find('\n')) == "fsck: verifying chunks: 0 B / 100.0 MiB (0%)");
  CHECK(text.substr(text.rfind('\n', text.size() - 2) + 1) == "fsck: done\n");
}

TEST_CASE("off prints nothing, not even the summary", "[tools][progress]") {
  Captured out;
  {
    ProgressLine line("put m1", ProgressMode::kOff, out.f);
    line.update_bytes(1, 2);
    line.finish();
    CHECK(line.lines_written() == 0);
  }
  CHECK(out.text().empty());
}

TEST_CASE("an abandoned terminal line is cleared", "[tools][progress]") {
  double now = 0;
  Captured out;
  {
    ProgressLine line("put m1", ProgressMode::kTerminal, out.f, [&] { return now; });
    line.update_bytes(1, 2);
  }  // destroyed unfinished: an error message follows on a clean line
  const std::string text = out.text();
  CHECK(text.size() >= 3);
  CHECK(text.substr(text.size() - 4) == "\r\x1b[K");
}
