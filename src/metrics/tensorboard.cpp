// Writes TensorBoard's event.proto messages (field numbers from
// tensorflow/core/util/event.proto and summary.proto) framed as TFRecords.
#include "meshtrain/metrics/tensorboard.h"

#include <cerrno>
#include <chrono>
#include <ctime>
#include <filesystem>

#include "meshtrain/core/check.h"
#include "meshtrain/core/crc32c.h"
#include "meshtrain/core/fs.h"
#include "meshtrain/core/host.h"
#include "proto_wire.h"

namespace meshtrain {

namespace {

// Event fields.
constexpr uint32_t kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5, kSessionLog = 7;
// SessionLog fields and its status enum.
constexpr uint32_t kSessionStatus = 1;
constexpr int64_t kSessionStart = 1;
// Summary / Summary.Value fields.
constexpr uint32_t kSummaryValue = 1, kValueTag = 1, kSimpleValue = 2;

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string event_header(int64_t step) {
  std::string e;
  proto::put_double(e, kWallTime, now_seconds());
  proto::put_int64(e, kStep, step);
  return e;
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MT_CHECK(!ec, "cannot create TensorBoard directory '", dir, "': ", ec.message());
  path_ = (std::filesystem::path(dir) /
           ("events.out.tfevents." + std::to_string(std::time(nullptr)) + "." + hostname()))
              .string();
  // Appending keeps a valid stream if a resumed run lands on the same second.
  out_.open(path_, std::ios::binary | std::ios::app);
  MT_CHECK(out_.good(), "cannot open TensorBoard event file '", path_, "' for writing");
  // TensorBoard recognises the file by this first event.
  std::string e = event_header(0);
  proto::put_bytes(e, kFileVersion, "brain.Event:2");
  write_record(e);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (out_.is_open()) out_.flush();
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  std::string v;
  proto::put_bytes(v, kValueTag, tag);
  proto::put_float(v, kSimpleValue, static_cast<float>(value));
  std::string summary;
  proto::put_bytes(summary, kSummaryValue, v);
  std::string e = event_header(step);
  proto::put_bytes(e, kSummary, summary);
  write_record(e);
}

void TensorBoardWriter::add_session_start(int64_t step) {
  std::string log;
  proto::put_int64(log, kSessionStatus, kSessionStart);
  std::string e = event_header(step);
  proto::put_bytes(e, kSessionLog, log);
  write_record(e);
}

void TensorBoardWriter::flush() {
  out_.flush();
  MT_CHECK(out_.good(), "cannot write TensorBoard event file '", path_, "': ", write_failure(errno));
}

// TFRecord framing: uint64 length, masked CRC of those 8 bytes, data, masked CRC of data.
void TensorBoardWriter::write_record(const std::string& data) {
  std::string rec;
  rec.reserve(data.size() + 16);
  proto::put_le(rec, data.size(), 8);
  proto::put_le(rec, masked_crc32c(rec.data(), 8), 4);
  rec += data;
  proto::put_le(rec, masked_crc32c(data.data(), data.size()), 4);
  out_.write(rec.data(), static_cast<std::streamsize>(rec.size()));
  MT_CHECK(out_.good(), "cannot write TensorBoard event file '", path_, "': ", write_failure(errno));
}

}  // namespace meshtrain
