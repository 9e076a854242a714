#pragma once
// TensorBoard event files without TensorFlow or protobuf: the file is a TFRecord
// stream of hand-encoded `Event` messages, so a plain C++ binary can write scalars
// that `tensorboard --logdir` reads. The reader exists so tests (and users
// debugging a run) can check every checksum and see what was written.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace meshtrain {

// TFRecord stores CRC-32C (core/crc32c.h) in a rotated-and-offset form (a CRC
// of data that itself holds CRCs is weak, hence the mask).
uint32_t masked_crc32c(const void* data, size_t n);

// Appends scalar events to `dir/events.out.tfevents.<unix time>.<hostname>`.
// Not thread-safe; one writer per run directory (rank 0).
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  // SessionLog{status: START} at `step`: TensorBoard ignores the first one it
  // reads in a run directory and, at every later one, discards the events it
  // read before with a step >= `step` (a restarted run replaces them).
  void add_session_start(int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::string path_;
  std::ofstream out_;
};

struct TbScalar {
  std::string tag;
  int64_t step = 0;
  float value = 0;  // TensorBoard's simple_value is a float
  double wall_time = 0;
};

// The payloads of every record in a TFRecord file, in order; throws naming the
// file and record index when a length or data checksum does not match or the
// file ends inside a record.
std::vector<std::string> read_tfrecords(const std::string& file);

// The scalar summaries of an event file, in file order.
std::vector<TbScalar> read_tensorboard_scalars(const std::string& file);

// The steps of an event file's SessionLog START events, in file order.
std::vector<int64_t> read_tensorboard_session_starts(const std::string& file);

// The scalars of every event file in `dir` as TensorBoard shows them: files in
// name (= creation time) order, and at each SessionLog START after the first,
// what was read before with a step >= the START's step dropped
// (tensorboard/backend/event_processing: _CheckForRestartAndMaybePurge).
std::vector<TbScalar> read_tensorboard_dir(const std::string& dir);

}  // namespace meshtrain
