// A checkpoint's write off the training loop's thread. The caller copies the model off the
// device; the file's write, its fsync and rename, and the pruning of old checkpoints then run
// on a thread of their own while the steps go on. One write at a time: the next start() first
// waits for the one before. A write's failure is thrown by the next start() or wait(), so the
// caller reports it (to every rank) at its next save or at the end of the run. The destructor
// waits for a write still in flight: a run that stops on an error keeps the checkpoint it had
// begun to write. Knows nothing of the file format (ckpt.hpp) or the folder (ckpt_folder.hpp).
#pragma once
#include <exception>
#include <functional>
#include <string>
#include <thread>

namespace dpt {

class CheckpointWriter {
 public:
  // background = false, or an HDF5 library built without thread safety (the loop's thread may
  // read a dataset meanwhile): every write runs inside start(), as the caller's own call.
  explicit CheckpointWriter(bool background);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Waits for the write before, throwing its error if it failed; then runs `write`.
  void start(std::function<void()> write);
  // Waits for the write in flight, if any; throws its error if it failed.
  void wait();
  // Writes run on their own thread.
  bool background() const { return background_; }

 private:
  bool background_;
  std::thread thread_;
  std::exception_ptr error_;  // set by the thread before it ends; read after join()
};

// HDF5 as linked says it is thread-safe (H5is_library_threadsafe).
bool hdf5_threadsafe();

}  // namespace dpt
