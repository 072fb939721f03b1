// The file lists of `dpdata images`. The folder walk reproduces torchvision 0.14's
// find_classes and make_dataset (datasets/folder.py): names compared as bytes (Python compares
// the str os.scandir gives by code point, the same order for UTF-8 names), symlinks to folders
// followed, a folder whose device and inode are already on the path from the root not entered
// again (os.walk would follow such a loop until the path grows too long, listing its files again
// at every turn).
#include "image_list.hpp"
#include "internal.hpp"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "dpt/check.hpp"
#include "dpt/data.hpp"

namespace dpt::image {
namespace {

// Bytes of the UTF-8 sequence at s[i], or 0 when it is not one (overlong forms, surrogates and
// code points past U+10FFFF included).
size_t utf8_at(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return i + k < s.size() ? uint8_t(s[i + k]) : uint8_t(0); };
  const uint8_t c = b(0);
  if (c < 0x80) return 1;
  auto cont = [&](size_t k) { return (b(k) & 0xc0) == 0x80; };
  if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
  if (c >= 0xe0 && c <= 0xef) {
    const bool ok = cont(1) && cont(2) && !(c == 0xe0 && b(1) < 0xa0) && !(c == 0xed && b(1) >= 0xa0);
    return ok ? 3 : 0;
  }
  if (c >= 0xf0 && c <= 0xf4) {
    const bool ok = cont(1) && cont(2) && cont(3) && !(c == 0xf0 && b(1) < 0x90) && !(c == 0xf4 && b(1) >= 0x90);
    return ok ? 4 : 0;
  }
  return 0;
}

bool is_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_at(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

bool image_extension(const std::string& name) {
  std::string lower(name);
  for (char& ch : lower) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  auto ends = [&](const char* e) {
    const size_t n = std::strlen(e);
    return lower.size() >= n && lower.compare(lower.size() - n, n, e) == 0;
  };
  return ends(".jpg") || ends(".jpeg") || ends(".png");
}

std::string join(const std::string& a, const std::string& b) {
  return a.empty() || a.back() == '/' ? a + b : a + "/" + b;
}

struct Entries {
  std::vector<std::string> dirs, files;  // sorted
};

// One folder's entries, told apart as os.walk does: a folder, or a symlink to one, is a folder;
// everything else (a broken symlink too) a file. false when the folder cannot be read.
bool read_entries(const std::string& dir, Entries& e, std::string& why) {
  DIR* d = opendir(dir.c_str());
  if (!d) {
    why = std::strerror(errno);
    return false;
  }
  while (const dirent* ent = readdir(d)) {
    const std::string name = ent->d_name;
    if (name == "." || name == "..") continue;
    struct stat st {};
    const bool folder = stat(join(dir, name).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    (folder ? e.dirs : e.files).push_back(name);
  }
  closedir(d);
  std::sort(e.dirs.begin(), e.dirs.end());
  std::sort(e.files.begin(), e.files.end());
  return true;
}

struct Visited {
  dev_t dev;
  ino_t ino;
  std::string path;
};

// One class folder's files in make_dataset's order: every folder under it (itself first) sorted
// by its path, each folder's files sorted by name.
class ClassWalk {
 public:
  ClassWalk(std::vector<Visited> ancestors, std::vector<Skip>& skipped)
      : stack_(std::move(ancestors)), skipped_(skipped) {}

  std::vector<std::string> files(const std::string& class_dir) {
    walk(class_dir, "");
    std::sort(found_.begin(), found_.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::string> out;
    for (const auto& [rel, names] : found_)
      for (const std::string& n : names) out.push_back(join(join(class_dir, rel), n));
    return out;
  }

 private:
  std::vector<Visited> stack_;
  std::vector<Skip>& skipped_;
  std::vector<std::pair<std::string, std::vector<std::string>>> found_;  // path under the class, files

  void walk(const std::string& abs, const std::string& rel) {
    struct stat st {};
    if (stat(abs.c_str(), &st) != 0) return;
    for (const Visited& v : stack_)
      if (v.dev == st.st_dev && v.ino == st.st_ino) {
        skipped_.push_back({abs, "symlink loop: leads back to '" + printable(v.path) + "'; not followed"});
        return;
      }
    Entries e;
    std::string why;
    if (!read_entries(abs, e, why)) {
      skipped_.push_back({abs, "cannot read folder: " + why});
      return;
    }
    found_.emplace_back(rel, e.files);
    stack_.push_back({st.st_dev, st.st_ino, abs});
    for (const std::string& d : e.dirs) walk(join(abs, d), join(rel, d));
    stack_.pop_back();
  }
};

}  // namespace

std::string printable(const std::string& path) {
  std::string out;
  for (size_t i = 0; i < path.size();) {
    const size_t n = utf8_at(path, i);
    const uint8_t c = uint8_t(path[i]);
    if (n == 0 || c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
      ++i;
    } else {
      out.append(path, i, n);
      i += n;
    }
  }
  return out;
}

Listing list_folder(const std::string& dir) {
  struct stat root {};
  if (stat(dir.c_str(), &root) != 0)
    throw InputError("image folder '" + printable(dir) + "': " + std::strerror(errno));
  if (!S_ISDIR(root.st_mode)) throw InputError("image folder '" + printable(dir) + "': not a folder");
  Entries top;
  std::string why;
  if (!read_entries(dir, top, why)) throw InputError("image folder '" + printable(dir) + "': cannot read: " + why);
  if (top.dirs.empty())
    throw InputError("image folder '" + printable(dir) + "' has no subfolders; expected one folder per class "
                     "(torchvision's ImageFolder layout: DIR/<class>/<image>)");
  Listing l;
  for (const std::string& f : top.files)
    l.skipped.push_back({join(dir, f), "not in a class folder (torchvision skips it too)", true});
  data_internal::check_class_names("image folder '" + printable(dir) + "'", top.dirs);
  for (const std::string& name : top.dirs) {
    if (!is_utf8(name))
      throw InputError("image folder '" + printable(dir) + "': class folder '" + printable(name) +
                       "' is not a UTF-8 name; class names are stored as UTF-8 text: rename it");
    const int label = int(l.classes.size());
    l.classes.push_back(name);
    const std::string class_dir = join(dir, name);
    ClassWalk walk({{root.st_dev, root.st_ino, dir}}, l.skipped);
    int64_t count = 0;
    for (std::string& f : walk.files(class_dir)) {
      if (image_extension(f)) {
        l.samples.push_back({std::move(f), label});
        ++count;
      } else {
        l.skipped.push_back({f, "not .jpg, .jpeg or .png (torchvision skips it too)", true});
      }
    }
    if (count == 0)
      l.skipped.push_back({class_dir, "class '" + name + "' (index " + std::to_string(label) +
                                          ") has no .jpg, .jpeg or .png file: it keeps its index and has no rows"});
  }
  return l;
}

namespace {

struct CsvRow {
  std::vector<std::string> cells;
  int64_t line = 0;
};

// RFC 4180 as Python's csv writes it: commas, "quoted" fields with "" for a quote, \n or \r\n.
std::vector<CsvRow> parse_csv(const std::string& s, const std::string& where) {
  std::vector<CsvRow> rows;
  size_t i = s.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;
  int64_t line = 1;
  while (i < s.size()) {
    CsvRow r;
    r.line = line;
    for (bool end = false; !end;) {
      std::string cell;
      if (i < s.size() && s[i] == '"') {
        for (++i;; ++i) {
          if (i >= s.size()) throw InputError(where + ": line " + std::to_string(r.line) + ": unclosed quote");
          if (s[i] == '"' && (i + 1 >= s.size() || s[i + 1] != '"')) break;
          if (s[i] == '"') ++i;
          if (s[i] == '\n') ++line;
          cell += s[i];
        }
        ++i;
      }
      while (i < s.size() && s[i] != ',' && s[i] != '\n' && s[i] != '\r') cell += s[i++];
      r.cells.push_back(cell);
      if (i >= s.size()) break;
      const char sep = s[i++];
      if (sep == ',') continue;
      if (sep == '\r' && i < s.size() && s[i] == '\n') ++i;
      ++line;
      end = true;
    }
    const bool blank = r.cells.size() == 1 && r.cells[0].find_first_not_of(" \t") == std::string::npos;
    if (!blank) rows.push_back(std::move(r));
  }
  return rows;
}

std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

bool integer(const std::string& s, int64_t& v) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  v = std::stoll(s);
  return true;
}

}  // namespace

Listing list_csv(const std::string& csv, const std::string& root_arg) {
  const std::string where = "image list '" + printable(csv) + "'";
  std::ifstream f(csv, std::ios::binary);
  if (!f) throw InputError(where + ": cannot open: " + std::strerror(errno));
  std::stringstream text;
  text << f.rdbuf();
  const std::vector<CsvRow> rows = parse_csv(text.str(), where);
  if (rows.empty() || rows[0].cells.size() != 2 || trimmed(rows[0].cells[0]) != "path" ||
      trimmed(rows[0].cells[1]) != "label")
    throw InputError(where + ": the first line must be the header path,label");
  const size_t slash = csv.rfind('/');
  const std::string root = !root_arg.empty() ? root_arg : slash == std::string::npos ? "." : csv.substr(0, slash);
  std::vector<std::string> labels;
  Listing l;
  int integers = 0;
  for (size_t r = 1; r < rows.size(); ++r) {
    const CsvRow& row = rows[r];
    const std::string at = where + ": line " + std::to_string(row.line);
    if (row.cells.size() != 2)
      throw InputError(at + ": has " + std::to_string(row.cells.size()) + " fields; expected path,label");
    const std::string path = row.cells[0], label = trimmed(row.cells[1]);
    if (path.empty()) throw InputError(at + ": empty path");
    if (label.empty()) throw InputError(at + ": empty label");
    int64_t v = 0;
    integers += integer(label, v);
    if (integers != 0 && integers != int(r))
      throw InputError(at + ": label '" + label + "': labels are all class indices (integers from 0) or all "
                       "class names, and this file mixes them");
    l.samples.push_back({path[0] == '/' ? path : join(root, path), 0});
    labels.push_back(label);
  }
  if (l.samples.empty()) throw InputError(where + ": has a header and no rows");
  if (integers) {
    int64_t hi = 0;
    for (size_t i = 0; i < labels.size(); ++i) {
      int64_t v = 0;
      integer(labels[i], v);
      l.samples[i].label = int(v);
      hi = std::max(hi, v);
    }
    if (hi >= 1000000) throw InputError(where + ": label " + std::to_string(hi) + " is over 999999");
    l.classes.assign(size_t(hi + 1), std::string());
  } else {
    l.classes = labels;
    std::sort(l.classes.begin(), l.classes.end());
    l.classes.erase(std::unique(l.classes.begin(), l.classes.end()), l.classes.end());
    data_internal::check_class_names(where, l.classes);
    for (size_t i = 0; i < labels.size(); ++i)
      l.samples[i].label = int(std::lower_bound(l.classes.begin(), l.classes.end(), labels[i]) - l.classes.begin());
  }
  return l;
}

void split_val(const std::vector<Sample>& all, int num_classes, double fraction, uint64_t seed,
               std::vector<Sample>& train, std::vector<Sample>& val) {
  std::vector<std::vector<size_t>> by_class(static_cast<size_t>(num_classes));
  for (size_t i = 0; i < all.size(); ++i) by_class[size_t(all[i].label)].push_back(i);
  std::vector<char> to_val(all.size(), 0);
  SplitMix64 rng(seed);
  for (std::vector<size_t>& idx : by_class) {
    const int64_t n = int64_t(idx.size());
    int64_t k = std::llround(fraction * double(n));
    if (n >= 2 && fraction > 0) k = std::clamp<int64_t>(k, 1, n - 1);
    if (n < 2) k = 0;
    for (int64_t j = 0; j < k; ++j) {  // the first k of a Fisher-Yates shuffle
      const size_t pick = size_t(j) + size_t(rng.below(uint64_t(n - j)));
      std::swap(idx[size_t(j)], idx[pick]);
      to_val[idx[size_t(j)]] = 1;
    }
  }
  for (size_t i = 0; i < all.size(); ++i) (to_val[i] ? val : train).push_back(all[i]);
}

}  // namespace dpt::image
