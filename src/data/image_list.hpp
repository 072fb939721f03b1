// Which files `dpdata images` imports, with which label, in which order: an image folder walked
// as torchvision's ImageFolder walks it, or a CSV of path,label; and the stratified validation
// split. Private to src/data/. Reads directory entries only, never image bytes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dpt::image {

struct Sample {
  std::string path;
  int label = 0;
};

// A path or problem the user should hear of: path TAB reason in the report.
struct Skip {
  std::string path, reason;
  bool ignored = false;  // a file torchvision ignores too (no image extension, outside a class folder)
};

struct Listing {
  std::vector<std::string> classes;  // class i's name
  std::vector<Sample> samples;       // in torchvision's sample order (folder) or the CSV's
  std::vector<Skip> skipped;
};

// ImageFolder's classes and samples (see docs/formats.md): classes are the sorted names of the
// folder's subfolders (symlinks to folders included), samples each class's files, nested folders
// walked, in the order of sorted(os.walk(class, followlinks=True)) and sorted names. Files
// without a .jpg/.jpeg/.png extension, symlink loops, unreadable folders and classes with no
// image file are listed in skipped (the class keeps its index).
Listing list_folder(const std::string& dir);
// A CSV file with the header path,label: label a class name (names numbered in sorted order) or
// an integer index, for every row; paths relative to root (default: the CSV's folder).
Listing list_csv(const std::string& csv, const std::string& root);

// Stratified split: from each class of n files, round(fraction · n) go to val (at least 1 and at
// most n - 1 when n >= 2; none when n = 1), chosen by SplitMix64(seed); both keep the order.
void split_val(const std::vector<Sample>& all, int num_classes, double fraction, uint64_t seed,
               std::vector<Sample>& train, std::vector<Sample>& val);

// A path for messages and the report: bytes that are not UTF-8 written as \xNN.
std::string printable(const std::string& path);

}  // namespace dpt::image
