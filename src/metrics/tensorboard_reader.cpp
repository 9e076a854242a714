// Reads back what TensorBoardWriter writes, checking every checksum: the tests'
// proof that the file is what TensorBoard expects, byte for byte.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>

#include "meshtrain/core/check.h"
#include "meshtrain/metrics/tensorboard.h"
#include "proto_wire.h"

namespace meshtrain {

std::vector<std::string> read_tfrecords(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  MT_CHECK(in.good(), "cannot open TFRecord file '", file, "'");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t index = records.size();
    MT_CHECK(bytes.size() - pos >= 12, "TFRecord file '", file, "': record ", index,
             " is truncated inside its header (", bytes.size() - pos, " bytes left)");
    const char* head = bytes.data() + pos;
    const uint64_t len = proto::get_le(head, 8);
    const auto len_crc = static_cast<uint32_t>(proto::get_le(head + 8, 4));
    MT_CHECK(len_crc == masked_crc32c(head, 8), "TFRecord file '", file, "': record ", index,
             " has a bad length checksum (file corrupted)");
    pos += 12;
    MT_CHECK(len <= bytes.size() - pos && bytes.size() - pos - len >= 4, "TFRecord file '", file,
             "': record ", index, " is truncated (length ", len, ", ", bytes.size() - pos, " bytes left)");
    std::string data = bytes.substr(pos, len);
    const auto data_crc = static_cast<uint32_t>(proto::get_le(bytes.data() + pos + len, 4));
    MT_CHECK(data_crc == masked_crc32c(data.data(), data.size()), "TFRecord file '", file, "': record ",
             index, " has a bad data checksum (file corrupted)");
    pos += len + 4;
    records.push_back(std::move(data));
  }
  return records;
}

namespace {

// One event as the readers below need it: a SessionLog START, or the scalars of a summary.
struct TbEvent {
  int64_t step = 0;
  bool session_start = false;
  std::vector<TbScalar> scalars;
};

std::vector<TbScalar> summary_scalars(std::string_view summary_bytes, int64_t step, double wall_time) {
  std::vector<TbScalar> out;
  proto::WireType type;
  proto::Reader summary(summary_bytes);
  while (!summary.done()) {
    const uint32_t field = summary.next(type);
    if (!(field == 1 && type == proto::kLengthDelimited)) {
      summary.skip(type);
      continue;
    }
    proto::Reader value(summary.bytes());
    TbScalar sc;
    sc.step = step;
    sc.wall_time = wall_time;
    bool has_simple = false;
    while (!value.done()) {
      const uint32_t vf = value.next(type);
      if (vf == 1 && type == proto::kLengthDelimited) sc.tag = std::string(value.bytes());
      else if (vf == 2 && type == proto::kFixed32) sc.value = value.as_float(), has_simple = true;
      else value.skip(type);
    }
    if (has_simple) out.push_back(std::move(sc));
  }
  return out;
}

// SessionLog: status (field 1, enum; START = 1).
bool is_session_start(std::string_view session_log) {
  proto::Reader r(session_log);
  proto::WireType type;
  while (!r.done()) {
    const uint32_t field = r.next(type);
    if (field == 1 && type == proto::kVarint) return r.varint() == 1;
    r.skip(type);
  }
  return false;
}

std::vector<TbEvent> read_events(const std::string& file) {
  std::vector<TbEvent> out;
  const std::vector<std::string> records = read_tfrecords(file);
  for (size_t i = 0; i < records.size(); ++i) {
    try {
      double wall_time = 0;
      TbEvent ev;
      std::vector<std::string_view> summaries;
      proto::Reader event(records[i]);
      proto::WireType type;
      while (!event.done()) {
        const uint32_t field = event.next(type);
        if (field == 1 && type == proto::kFixed64) wall_time = event.as_double();
        else if (field == 2 && type == proto::kVarint) ev.step = static_cast<int64_t>(event.varint());
        else if (field == 5 && type == proto::kLengthDelimited) summaries.push_back(event.bytes());
        else if (field == 7 && type == proto::kLengthDelimited) ev.session_start = is_session_start(event.bytes());
        else event.skip(type);
      }
      for (std::string_view s : summaries)
        for (auto& sc : summary_scalars(s, ev.step, wall_time)) ev.scalars.push_back(std::move(sc));
      out.push_back(std::move(ev));
    } catch (const Error& e) {
      MT_FAIL("TensorBoard file '", file, "': record ", i, ": ", e.what());
    }
  }
  return out;
}

}  // namespace

std::vector<TbScalar> read_tensorboard_scalars(const std::string& file) {
  std::vector<TbScalar> out;
  for (auto& ev : read_events(file))
    for (auto& sc : ev.scalars) out.push_back(std::move(sc));
  return out;
}

std::vector<int64_t> read_tensorboard_session_starts(const std::string& file) {
  std::vector<int64_t> out;
  for (const auto& ev : read_events(file))
    if (ev.session_start) out.push_back(ev.step);
  return out;
}

std::vector<TbScalar> read_tensorboard_dir(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  std::vector<TbScalar> out;
  bool seen_start = false;
  for (const auto& f : files)
    for (auto& ev : read_events(f)) {
      if (ev.session_start && seen_start)
        out.erase(std::remove_if(out.begin(), out.end(), [&](const TbScalar& s) { return s.step >= ev.step; }),
                  out.end());
      seen_start = seen_start || ev.session_start;
      for (auto& sc : ev.scalars) out.push_back(std::move(sc));
    }
  return out;
}

}  // namespace meshtrain
