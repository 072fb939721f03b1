// What the importers of users' arrays (npy_import.cpp, csv_import.cpp) share: num_classes decided
// (given, or max label + 1 with a line saying so), labels and features held to the HDF5 reader's
// checks and messages, and the notes the user sees.
#include "import.hpp"

#include <algorithm>
#include <cmath>

#include "dpt/check.hpp"

namespace dpt::data_internal {

void note(const ImportOptions& o, const std::string& line) {
  if (o.notes) o.notes->push_back(line);
}

namespace {

// Labels are class indices from 0; a dataset whose labels start at 1 leaves class 0 empty,
// which trains (the model just never predicts it) but is rarely what the user meant.
void note_empty_classes(const std::vector<int32_t>& labels, int num_classes, const ImportOptions& o) {
  std::vector<char> seen(size_t(num_classes), 0);
  for (int32_t y : labels) seen[size_t(y)] = 1;
  const int64_t empty = std::count(seen.begin(), seen.end(), 0);
  if (empty == 0) return;
  if (empty == 1 && !seen[0])
    note(o, "no row has label 0: dptrain counts classes from 0 (labels numbered from 1? subtract 1)");
  else
    note(o, std::to_string(empty) + " of " + std::to_string(num_classes) + " classes have no rows");
}

int inferred_classes(const std::vector<int64_t>& raw, const std::string& where, const RowName& row,
                     const ImportOptions& o) {
  int64_t hi = 0;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] < 0)
      throw InputError(where + ": " + row(i) + " has label " + std::to_string(raw[i]) +
                       "; labels are class indices counted from 0");
    hi = std::max(hi, raw[i]);
  }
  const int k = check_num_classes(where + ": the largest label + 1 (the number of classes)", double(hi) + 1);
  note(o, "num_classes = " + std::to_string(k) + " (the largest label + 1; --num-classes sets it)");
  return k;
}

}  // namespace

void set_labels(Dataset& ds, const std::vector<int64_t>& raw, const std::string& where, const RowName& row,
                const ImportOptions& o) {
  ds.num_classes = o.num_classes ? check_num_classes("--num-classes", double(*o.num_classes))
                                 : inferred_classes(raw, where, row, o);
  ds.labels.resize(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] < 0 || raw[i] >= ds.num_classes) label_out_of_range(where, row(i), raw[i], ds.num_classes);
    ds.labels[i] = int32_t(raw[i]);
  }
  note_empty_classes(ds.labels, ds.num_classes, o);
}

void check_finite(const Dataset& ds, const std::string& where, const RowName& row) {
  for (size_t i = 0; i < ds.f32.size(); ++i)
    if (!std::isfinite(ds.f32[i])) non_finite_feature(where, row(i / size_t(ds.dim)));
}

}  // namespace dpt::data_internal
