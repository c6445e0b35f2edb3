// Safetensors files in and out of the daemon (see model_file.hpp).
#include "api/cpp/model_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>

#include "core/safetensors.hpp"
#include "core/wire.hpp"

namespace cairn {
namespace {

using nlohmann::json;

constexpr uint64_t kProgressStep = 8ull << 20;

// Counts bytes against a total for a FileProgress (nothing without one).
struct ByteCounter {
  const FileProgress& report;
  ProgressSnapshot s;
  void add(uint64_t n) {
    s.done += n;
    if (report) report(s);
  }
};

Status pread_full(int fd, uint8_t* dst, uint64_t n, uint64_t off, const std::string& path,
                  ByteCounter* counter = nullptr) {
  while (n > 0) {
    ssize_t r = ::pread(fd, dst, counter ? std::min(n, kProgressStep) : n, static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno_status("reading '" + path + "'", errno);
    }
    if (r == 0) return invalid_argument("'" + path + "' is shorter than its header says (truncated file?)");
    dst += r, n -= static_cast<uint64_t>(r), off += static_cast<uint64_t>(r);
    if (counter) counter->add(static_cast<uint64_t>(r));
  }
  return Status::OK();
}

}  // namespace

Status put_safetensors_file(Connection& client, const std::string& id, const std::string& file,
                            const std::string& parent, Durability durability, const json& meta, const json& arch,
                            const FileProgress& progress) {
  if (!meta.is_null() && !meta.is_object()) return invalid_argument("the metadata must be a JSON object");
  auto header = safetensors::read_header(file);
  if (!header.ok()) return header.status();
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status("opening '" + file + "'", errno);
  std::string header_json(header->header_bytes, '\0');
  Status st = pread_full(fd, reinterpret_cast<uint8_t*>(header_json.data()), header->header_bytes, 8, file);
  if (!st.ok()) {
    ::close(fd);
    return st;
  }
  ConnectionWriter w(client, id, parent);
  if (meta.is_object() && !meta.empty()) st = w.set_metadata(meta);
  if (st.ok() && !arch.is_null()) st = w.set_architecture(arch);
  w.set_source_header(header_json);
  ByteCounter counter{progress, {"reading " + file, ProgressUnit::kBytes, 0, 0}};
  for (const auto& t : header->tensors) counter.s.total += t.nbytes();
  if (progress) progress(counter.s);
  std::vector<uint8_t> small;
  for (const auto& t : header->tensors) {
    if (!st.ok()) break;
    uint64_t off = header->data_offset() + t.begin;
    if (t.nbytes() <= kInlineLimit) {
      small.resize(t.nbytes());
      st = pread_full(fd, small.data(), t.nbytes(), off, file);
      if (st.ok()) st = w.add_tensor(t.name, small.data(), t.dtype, t.shape);
      if (st.ok()) counter.add(t.nbytes());
    } else {
      // Straight from the file into the daemon's arena: no intermediate buffer.
      auto space = w.add_tensor_space(t.name, t.dtype, t.shape);
      st = space.ok() ? pread_full(fd, *space, t.nbytes(), off, file, &counter) : space.status();
    }
  }
  ::close(fd);
  if (!st.ok()) return st;
  if (progress) progress(ProgressSnapshot{"committing", ProgressUnit::kBytes, 0, 0});
  auto r = w.commit(durability, true);
  return r.ok() ? Status::OK() : r.status();
}

Status get_safetensors_file(Connection& client, const std::string& id, const std::string& out,
                            const std::vector<std::string>& only, const FileProgress& progress) {
  auto opened = client.call(json{{"op", "open"}, {"id", id}, {"with_source_header", true}});
  if (!opened.ok()) return opened.status();
  auto reader = ConnectionReader::open(client, id);
  if (!reader.ok()) return reader.status();
  std::vector<std::string> names;
  if (only.empty()) {
    for (const auto& t : (*reader)->tensors()) names.push_back(t.name);
  } else {
    for (const auto& n : only) {
      if (!(*reader)->find(n)) return not_found("model '" + id + "' has no tensor '" + n + "'");
      names.push_back(n);
    }
  }
  // The original header when the whole model is asked for and it came from a file: byte-exact.
  std::string prefix;
  std::map<std::string, std::string> file_metadata;
  bool have_file_metadata = false;
  if (opened->contains("source_header") && (*opened)["source_header"].is_string()) {
    std::string js = (*opened)["source_header"].get<std::string>();
    std::string p(8, '\0');
    for (int i = 0; i < 8; ++i) p[static_cast<size_t>(i)] = static_cast<char>((js.size() >> (8 * i)) & 0xff);
    p += js;
    uint64_t data_bytes = 0;
    for (const auto& t : (*reader)->tensors()) data_bytes += t.nbytes;
    auto h = safetensors::parse_header({reinterpret_cast<const uint8_t*>(p.data()), p.size()}, p.size() + data_bytes);
    if (h.ok()) {
      file_metadata = h->metadata;
      have_file_metadata = h->has_metadata;
      bool same_order = only.empty() && h->tensors.size() == names.size();
      for (size_t i = 0; same_order && i < names.size(); ++i) same_order = h->tensors[i].name == names[i];
      if (same_order) prefix = p;
    }
  }
  if (prefix.empty()) {
    std::vector<safetensors::TensorEntry> entries;
    for (const auto& n : names) {
      const auto* t = (*reader)->find(n);
      entries.push_back({t->name, t->dtype, t->shape, 0, 0});
    }
    auto built = safetensors::build_header(entries, have_file_metadata ? &file_metadata : nullptr);
    if (!built.ok()) return built.status();
    prefix = std::move(built).value();
  }
  std::string tmp = out + ".cairn-tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status("creating '" + tmp + "'", errno);
  Status st = wire::write_full(fd, prefix.data(), prefix.size());
  ByteCounter counter{progress, {"writing " + out, ProgressUnit::kBytes, 0, 0}};
  for (const auto& n : names) counter.s.total += (*reader)->find(n)->nbytes;
  if (progress) progress(counter.s);
  for (const auto& n : names) {
    if (!st.ok()) break;
    auto view = (*reader)->map(n);
    if (!view.ok()) {
      st = view.status();
      break;
    }
    const uint8_t* p = view->data();
    size_t left = view->size();
    while (st.ok() && left > 0) {
      ssize_t w = ::write(fd, p, std::min<size_t>(left, kProgressStep));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0)
        st = errno_status("writing '" + tmp + "'", errno);
      else
        p += w, left -= static_cast<size_t>(w), counter.add(static_cast<uint64_t>(w));
    }
    (*reader)->close();
  }
  if (::close(fd) != 0 && st.ok()) st = errno_status("closing '" + tmp + "'", errno);
  if (st.ok() && std::rename(tmp.c_str(), out.c_str()) != 0) st = errno_status("renaming to '" + out + "'", errno);
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

}  // namespace cairn
