// RAII for HDF5 identifiers (hid_t), shared by the dataset and checkpoint layers: move-only,
// closed with the matching H5?close, and a destructor that never throws.
#pragma once
#include <hdf5.h>

#include <utility>

namespace dpt {

class H5Id {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Id() = default;
  H5Id(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  H5Id(H5Id&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  ~H5Id() { reset(); }

  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  // Explicit close whose status matters (H5Fclose flushes: a full disk shows up here).
  herr_t close() {
    herr_t rc = id_ >= 0 && closer_ ? closer_(id_) : 0;
    id_ = H5I_INVALID_HID;
    return rc;
  }
  void reset() noexcept {
    if (id_ >= 0 && closer_) closer_(id_);  // a destructor cannot report; close() can
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

}  // namespace dpt
