// metrics.jsonl, TensorBoard event files and the console line.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "meshtrain/core/check.h"
#include "meshtrain/core/crc32c.h"
#include "meshtrain/metrics/metrics.h"
#include "meshtrain/metrics/tensorboard.h"

namespace fs = std::filesystem;
using meshtrain::Error;
using nlohmann::json;

namespace {

fs::path scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() /
                     ("meshtrain_metrics_test_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p;
}

std::vector<std::string> lines_of(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  if (fs::exists(dir))
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
  return out;
}

}  // namespace

TEST(Crc32c, KnownVectors) {
  // RFC 3720 appendix B.4 and the classic check value.
  EXPECT_EQ(meshtrain::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(meshtrain::crc32c("", 0), 0x00000000u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  EXPECT_EQ(meshtrain::crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(meshtrain::crc32c(ones.data(), 32), 0x62A8AB43u);
  std::string inc(32, '\0');
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<char>(i);
  EXPECT_EQ(meshtrain::crc32c(inc.data(), 32), 0x46DD794Eu);
}

TEST(Crc32c, MaskIsRotateAndOffset) {
  const uint32_t c = meshtrain::crc32c("123456789", 9);
  EXPECT_EQ(meshtrain::masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

TEST(TensorBoard, WriteThenReadBack) {
  const fs::path dir = scratch("tb");
  std::string path;
  {
    meshtrain::TensorBoardWriter w(dir.string());
    path = w.path();
    w.add_scalar("loss", 4.25, 1);
    w.add_scalar("lr", 3e-4, 1);
    w.add_scalar("loss", 3.5, -2);  // negative steps use ten-byte varints
    w.flush();
  }
  EXPECT_EQ(fs::path(path).parent_path(), dir);
  EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);

  const auto records = meshtrain::read_tfrecords(path);
  ASSERT_EQ(records.size(), 4u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);

  const auto s = meshtrain::read_tensorboard_scalars(path);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].tag, "loss");
  EXPECT_EQ(s[0].step, 1);
  EXPECT_FLOAT_EQ(s[0].value, 4.25f);
  EXPECT_GT(s[0].wall_time, 1.6e9);
  EXPECT_EQ(s[1].tag, "lr");
  EXPECT_FLOAT_EQ(s[1].value, 3e-4f);
  EXPECT_EQ(s[2].step, -2);
  EXPECT_FLOAT_EQ(s[2].value, 3.5f);
  fs::remove_all(dir);
}

TEST(TensorBoard, FirstRecordBytesAreExact) {
  const fs::path dir = scratch("tb_bytes");
  meshtrain::TensorBoardWriter w(dir.string());
  w.flush();
  std::ifstream in(w.path(), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // wall_time (9 bytes) + step 0 (2) + file_version (2 + 13).
  ASSERT_EQ(bytes.size(), 12u + 26u + 4u);
  EXPECT_EQ(static_cast<unsigned char>(bytes[0]), 26);
  for (int i = 1; i < 8; ++i) EXPECT_EQ(bytes[i], 0);
  EXPECT_EQ(static_cast<unsigned char>(bytes[12]), 0x09);  // field 1, fixed64
  EXPECT_EQ(static_cast<unsigned char>(bytes[21]), 0x10);  // field 2, varint
  EXPECT_EQ(static_cast<unsigned char>(bytes[23]), 0x1A);  // field 3, bytes
  EXPECT_EQ(bytes.substr(25, 13), "brain.Event:2");
  fs::remove_all(dir);
}

TEST(TensorBoard, CorruptedByteIsDetected) {
  const fs::path dir = scratch("tb_corrupt");
  std::string path;
  {
    meshtrain::TensorBoardWriter w(dir.string());
    path = w.path();
    w.add_scalar("loss", 1.0, 7);
  }
  const auto size = fs::file_size(path);
  auto flip = [&](size_t offset) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char c;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(offset));
    f.put(static_cast<char>(c ^ 0x20));
  };
  // A byte in the second record's data: the error names the file and record 1.
  flip(size - 8);
  try {
    meshtrain::read_tensorboard_scalars(path);
    FAIL() << "corruption not detected";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("record 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("data checksum"), std::string::npos) << msg;
  }
  flip(size - 8);
  EXPECT_EQ(meshtrain::read_tensorboard_scalars(path).size(), 1u);
  // A byte of the first record's length: the length checksum catches it.
  flip(0);
  try {
    meshtrain::read_tfrecords(path);
    FAIL() << "corruption not detected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("record 0 has a bad length checksum"), std::string::npos)
        << e.what();
  }
  flip(0);
  // A file cut inside a record.
  fs::resize_file(path, size - 2);
  EXPECT_THROW(meshtrain::read_tfrecords(path), Error);
  fs::remove_all(dir);
}

TEST(MetricsLogger, OneObjectPerLineAndAppendsOnReopen) {
  const fs::path run = scratch("run");
  {
    meshtrain::MetricsLogger m(run.string(), true);
    m.log({{"step", 1}, {"loss", 4.5}, {"lr", 1e-4}, {"grad_norm", 0.5}, {"tokens_per_sec", 1000.0}});
    m.log({{"step", 2}, {"val_loss", 4.25}});
  }
  {
    meshtrain::MetricsLogger m(run.string(), true);  // a resumed run
    m.log({{"step", 3}, {"loss", 4.0}, {"expert_load", {0.25, 0.75}}, {"note", "text"}});
  }
  const auto lines = lines_of(run / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  for (const auto& l : lines) EXPECT_TRUE(json::parse(l).is_object()) << l;
  EXPECT_EQ(json::parse(lines[0])["loss"], 4.5);
  EXPECT_EQ(json::parse(lines[1])["val_loss"], 4.25);
  EXPECT_EQ(json::parse(lines[2])["step"], 3);

  std::vector<meshtrain::TbScalar> all;
  const auto tb_files = files_in(run / "tb");
  ASSERT_GE(tb_files.size(), 1u);
  for (const auto& f : tb_files)
    for (auto& s : meshtrain::read_tensorboard_scalars(f.string())) all.push_back(s);
  auto find = [&](const std::string& tag, int64_t step) -> const meshtrain::TbScalar* {
    for (const auto& s : all)
      if (s.tag == tag && s.step == step) return &s;
    return nullptr;
  };
  // 4 scalars at step 1, 1 at step 2, loss + 2 expert loads at step 3; "step" and text skipped.
  EXPECT_EQ(all.size(), 8u);
  ASSERT_NE(find("loss", 1), nullptr);
  EXPECT_FLOAT_EQ(find("loss", 1)->value, 4.5f);
  ASSERT_NE(find("val_loss", 2), nullptr);
  ASSERT_NE(find("expert_load/1", 3), nullptr);
  EXPECT_FLOAT_EQ(find("expert_load/1", 3)->value, 0.75f);
  EXPECT_EQ(find("step", 1), nullptr);
  EXPECT_EQ(find("note", 3), nullptr);
  fs::remove_all(run);
}

std::vector<int64_t> steps_of(const fs::path& file, const std::string& key) {
  std::vector<int64_t> out;
  for (const auto& l : lines_of(file)) {
    const auto r = json::parse(l);
    if (r.contains(key)) out.push_back(r["step"].get<int64_t>());
  }
  return out;
}

// A run that logged steps 1-6 (val_loss at 4) and died resumes from its
// checkpoint of step 4: steps 5-6 are trained again, and must not be there twice.
TEST(MetricsLogger, ResumeDropsTheRowsAfterItsStep) {
  const fs::path run = scratch("run_resume");
  {
    meshtrain::MetricsLogger m(run.string(), true, true, {0, false});
    for (int s = 1; s <= 6; ++s) {
      m.log({{"step", s}, {"loss", 10.0 - s}});
      if (s == 4) m.log({{"step", s}, {"val_loss", 7.5}});
    }
  }
  {
    meshtrain::MetricsLogger m(run.string(), true, true, {4, false});
    for (int s = 5; s <= 8; ++s) m.log({{"step", s}, {"loss", 20.0 - s}});
  }
  EXPECT_EQ(steps_of(run / "metrics.jsonl", "loss"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(steps_of(run / "metrics.jsonl", "val_loss"), (std::vector<int64_t>{4}));
  EXPECT_EQ(json::parse(lines_of(run / "metrics.jsonl").back())["loss"], 12.0);
  EXPECT_FALSE(fs::exists(run / "metrics.jsonl.tmp"));
  // TensorBoard as it shows the folder: the resumed file's START drops the
  // first file's steps 5 and 6, so each step has one loss, the newer one.
  std::vector<int64_t> tb_steps;
  for (const auto& sc : meshtrain::read_tensorboard_dir((run / "tb").string()))
    if (sc.tag == "loss") {
      tb_steps.push_back(sc.step);
      EXPECT_FLOAT_EQ(sc.value, static_cast<float>((sc.step <= 4 ? 10.0 : 20.0) - sc.step)) << "step " << sc.step;
    }
  EXPECT_EQ(tb_steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  fs::remove_all(run);
}

// Resuming from further back (train --checkpoint) drops every later row too.
TEST(MetricsLogger, ResumeFromFurtherBackDropsTheLaterHistory) {
  const fs::path run = scratch("run_back");
  {
    meshtrain::MetricsLogger m(run.string(), true, false);
    for (int s = 1; s <= 12; ++s) m.log({{"step", s}, {"loss", 1.0}});
  }
  { meshtrain::MetricsLogger m(run.string(), true, false, {8, false}); }
  EXPECT_EQ(steps_of(run / "metrics.jsonl", "loss"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  fs::remove_all(run);
}

// --fresh: a new history in a new file; the old one is kept beside it.
TEST(MetricsLogger, FreshSetsTheOldFilesAside) {
  const fs::path run = scratch("run_fresh");
  for (int attempt = 0; attempt < 3; ++attempt) {
    meshtrain::MetricsLogger m(run.string(), true, true, {0, attempt > 0});
    for (int s = 1; s <= 3 + attempt; ++s) m.log({{"step", s}, {"loss", 1.0 * attempt}});
  }
  EXPECT_EQ(steps_of(run / "metrics.jsonl", "loss"), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(steps_of(run / "metrics.jsonl.superseded", "loss"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(steps_of(run / "metrics.jsonl.superseded.1", "loss"), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_TRUE(fs::is_directory(run / "tb.superseded"));
  EXPECT_TRUE(fs::is_directory(run / "tb.superseded.1"));
  std::vector<int64_t> tb_steps;
  for (const auto& sc : meshtrain::read_tensorboard_dir((run / "tb").string())) tb_steps.push_back(sc.step);
  EXPECT_EQ(tb_steps, (std::vector<int64_t>{1, 2, 3, 4, 5}));
  fs::remove_all(run);
}

// TensorBoard's rule, on hand-made files: the first START is the run's start,
// a later one discards what came before from its step on.
TEST(TensorBoardDir, LaterSessionStartsPurgeFromTheirStep) {
  const fs::path dir = scratch("tb_purge");
  fs::create_directories(dir);
  {
    meshtrain::TensorBoardWriter w((dir / "a").string());
    w.add_session_start(1);
    for (int s = 1; s <= 5; ++s) w.add_scalar("loss", s, s);
    w.add_session_start(3);  // a restart from step 2 in the same file
    w.add_scalar("loss", 30, 3);
  }
  const auto files = files_in(dir / "a");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(meshtrain::read_tensorboard_session_starts(files[0].string()), (std::vector<int64_t>{1, 3}));
  std::vector<std::pair<int64_t, float>> seen;
  for (const auto& sc : meshtrain::read_tensorboard_dir((dir / "a").string())) seen.emplace_back(sc.step, sc.value);
  EXPECT_EQ(seen, (std::vector<std::pair<int64_t, float>>{{1, 1.f}, {2, 2.f}, {3, 30.f}}));
  fs::remove_all(dir);
}

TEST(MetricsLogger, WithoutTensorBoardWritesOnlyJsonl) {
  const fs::path run = scratch("run_notb");
  meshtrain::MetricsLogger m(run.string(), true, /*tensorboard=*/false);
  m.log({{"step", 1}, {"loss", 2.0}});
  EXPECT_EQ(lines_of(run / "metrics.jsonl").size(), 1u);
  EXPECT_FALSE(fs::exists(run / "tb"));
  fs::remove_all(run);
}

TEST(MetricsLogger, DisabledWritesNothing) {
  const fs::path run = scratch("run_disabled");
  meshtrain::MetricsLogger m(run.string(), false);
  m.log({{"step", 1}, {"loss", 2.0}});
  EXPECT_FALSE(m.enabled());
  EXPECT_FALSE(fs::exists(run));
}

TEST(MetricsLogger, RejectsRowsWithoutStep) {
  const fs::path run = scratch("run_bad");
  meshtrain::MetricsLogger m(run.string(), true);
  EXPECT_THROW(m.log({{"loss", 2.0}}), Error);
  EXPECT_THROW(m.log(json::array({1, 2})), Error);
  fs::remove_all(run);
}

TEST(StepLine, JaxformerStyleWithOnlyPresentKeys) {
  EXPECT_EQ(meshtrain::format_step_line(
                {{"step", 100}, {"loss", 4.12344}, {"val_loss", 4.5}, {"lr", 3e-4}, {"tokens_per_sec", 12345.678}}),
            "Step 100, Loss: 4.1234, Eval Loss: 4.5000, lr: 3.00e-04, tk/s: 12,345.68");
  EXPECT_EQ(meshtrain::format_step_line({{"step", 7}, {"loss", 2.0}}), "Step 7, Loss: 2.0000");
  EXPECT_EQ(meshtrain::format_step_line({{"step", 7}, {"val_loss", 2.0}}), "Step 7, Eval Loss: 2.0000");
  EXPECT_EQ(meshtrain::format_step_line({{"step", 1}, {"grad_norm", 0.5}, {"tokens_per_sec", 1234567.0}}),
            "Step 1, grad norm: 0.500, tk/s: 1,234,567.00");
  EXPECT_EQ(meshtrain::format_step_line({{"step", 1}, {"tokens_per_sec", 999.0}}), "Step 1, tk/s: 999.00");
}

TEST(Progress, Eta) {
  EXPECT_EQ(meshtrain::format_duration(0), "0s");
  EXPECT_EQ(meshtrain::format_duration(83), "1m23s");
  EXPECT_EQ(meshtrain::format_duration(7500), "2h05m");
  EXPECT_EQ(meshtrain::format_duration(200000), "2d07h");
  const meshtrain::Progress p(/*start_step=*/100, /*total_steps=*/1100);
  EXPECT_EQ(p.eta(100, 5.0), "ETA ?");
  // 10 steps in 10 s, 990 left.
  EXPECT_EQ(p.eta(110, 10.0), "ETA 16m30s");
  EXPECT_EQ(p.eta(1100, 100.0), "ETA 0s");
}
