// SummaryWriter: TensorBoard event files, as PyTorch's torch.utils.tensorboard.SummaryWriter.
//
//   monitor::SummaryWriter writer("runs/exp1");
//   writer.add_scalar("train/loss", loss, step);
//   writer.add_text("backend", "gloo", 0);
//   writer.flush();                       // TensorBoard sees what was written so far
//
// `tensorboard --logdir runs` then plots every tag. The file is a TFRecord stream
// (monitor/tfrecord.h) of tensorflow.Event protobuf messages. ddplab writes the few protobuf fields
// it needs by hand (Note [Event protobuf by hand] in summary_writer.cpp) rather than depending on
// protobuf and TensorFlow's .proto files.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace ddplab::monitor {

class SummaryWriter {
 public:
  // Creates `log_dir` if needed and a new file events.out.tfevents.<time>.<host>.<pid>.<n> in it,
  // starting with the file-version event TensorBoard expects first. Throws Error when the folder
  // or file cannot be created.
  explicit SummaryWriter(const std::string& log_dir);
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  // One point of the curve `tag` (TensorBoard's scalars dashboard). walltime: seconds since the
  // Unix epoch; < 0 takes now.
  void add_scalar(const std::string& tag, double value, int64_t global_step, double walltime = -1);
  // A text entry (TensorBoard's text dashboard; markdown).
  void add_text(const std::string& tag, const std::string& text, int64_t global_step,
                double walltime = -1);
  // Pushes buffered events to the file.
  void flush();
  void close();

  const std::string& log_dir() const { return log_dir_; }  // PyTorch: get_logdir()
  const std::string& file_name() const { return path_; }   // the event file's path

 private:
  void write_event(const std::string& event);

  std::string log_dir_, path_;
  std::ofstream out_;
};

}  // namespace ddplab::monitor
