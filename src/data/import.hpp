// What the importers of users' arrays share (import.cpp): the checks of the HDF5 reader applied
// to a dataset built in memory, and the notes for the user. Private to src/data/.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "internal.hpp"

namespace dpt::data_internal {

// Names row i of the source for messages: "row 7" (npy), "line 9" (CSV).
using RowName = std::function<std::string(size_t)>;

void note(const ImportOptions& o, const std::string& line);
// ds.labels and ds.num_classes from raw labels: num_classes as given, else the largest label + 1
// (with a note); every label checked against it. `where` names the labels' file.
void set_labels(Dataset& ds, const std::vector<int64_t>& raw, const std::string& where, const RowName& row,
                const ImportOptions& o);
// The reader's check that float features are finite.
void check_finite(const Dataset& ds, const std::string& where, const RowName& row);

}  // namespace dpt::data_internal
