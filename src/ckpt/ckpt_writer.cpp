// A checkpoint's write on a thread of its own (ckpt_writer.hpp).
#include "dpt/ckpt_writer.hpp"

#include <hdf5.h>

#include <utility>

#include "dpt/log.hpp"

namespace dpt {

bool hdf5_threadsafe() {
  hbool_t safe = 0;
  return H5is_library_threadsafe(&safe) >= 0 && safe;
}

CheckpointWriter::CheckpointWriter(bool background) : background_(background && hdf5_threadsafe()) {}

CheckpointWriter::~CheckpointWriter() {
  try {
    wait();
  } catch (const std::exception& e) {  // nobody left to report it to: said here
    log::error(e.what());
  }
}

void CheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (!error_) return;
  std::exception_ptr e = std::exchange(error_, nullptr);
  std::rethrow_exception(e);
}

void CheckpointWriter::start(std::function<void()> write) {
  wait();
  if (!background_) {
    write();
    return;
  }
  thread_ = std::thread([this, w = std::move(write)] {
    try {
      w();
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

}  // namespace dpt
