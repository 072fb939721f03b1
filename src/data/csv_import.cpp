// Import of a CSV file with a header row (dpdata csv): one column holds the labels (integer class
// indices, or class names numbered in sorted order), every other column is a float32 feature.
// Fields are separated by commas and may be quoted as RFC 4180 and Python's csv module write them
// ("a, b"; "" for a quote inside); lines end in \n or \r\n; blank lines are skipped; a UTF-8
// byte-order mark (Excel's) is dropped; spaces around a number are allowed. An empty or
// non-numeric cell is an error naming its line and column: nothing is guessed or filled in.
#include <sys/stat.h>

#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include "dpt/check.hpp"
#include "import.hpp"

namespace dpt {
using namespace data_internal;
namespace {

struct Record {
  std::vector<std::string> cells;
  int64_t line = 0;  // where the record begins, from 1
};

// Splits the text into records of fields.
class CsvReader {
 public:
  CsvReader(const std::string& text, const std::string& where) : s_(text), where_(where) {
    if (s_.compare(0, 3, "\xEF\xBB\xBF") == 0) i_ = 3;
  }

  // The next record that is not a blank line; false at the end of the text.
  bool next(Record& r) {
    while (i_ < s_.size()) {
      r.cells.clear();
      r.line = line_;
      bool quoted = false, end = false;
      while (!end) {
        r.cells.emplace_back();
        end = field(r.cells.back(), quoted);
      }
      const bool blank = r.cells.size() == 1 && !quoted && r.cells[0].find_first_not_of(" \t") == std::string::npos;
      if (!blank) return true;
    }
    return false;
  }

 private:
  const std::string& s_;
  std::string where_;
  size_t i_ = 0;
  int64_t line_ = 1;

  bool separator(size_t i) const { return s_[i] == ',' || s_[i] == '\n' || s_[i] == '\r'; }

  // Reads one field into out and consumes what ends it; true when that ends the record.
  bool field(std::string& out, bool& quoted) {
    size_t j = i_;
    while (j < s_.size() && s_[j] == ' ') ++j;
    if (j < s_.size() && s_[j] == '"') {
      quoted = true;
      const int64_t opened = line_;
      for (i_ = j + 1;; ++i_) {
        if (i_ >= s_.size())
          throw InputError(where_ + ": line " + std::to_string(opened) + ": a quote opened here is never closed");
        if (s_[i_] == '"' && (i_ + 1 >= s_.size() || s_[i_ + 1] != '"')) break;
        if (s_[i_] == '"') ++i_;  // "" inside quotes: one quote
        if (s_[i_] == '\n') ++line_;
        out += s_[i_];
      }
      for (++i_; i_ < s_.size() && s_[i_] == ' ';) ++i_;
      if (i_ < s_.size() && !separator(i_))
        throw InputError(where_ + ": line " + std::to_string(line_) + ": text after a closing quote");
    } else {
      const size_t start = i_;
      while (i_ < s_.size() && !separator(i_)) ++i_;
      out.assign(s_, start, i_ - start);
    }
    if (i_ >= s_.size()) return true;
    if (s_[i_++] == ',') return false;
    if (s_[i_ - 1] == '\r' && i_ < s_.size() && s_[i_] == '\n') ++i_;
    ++line_;
    return true;
  }
};

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::string read_text(const std::string& path, const std::string& where) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) throw InputError(where + ": cannot open: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw InputError(where + ": not a regular file");
  const uint64_t size = uint64_t(st.st_size);
  if (size > memory_cap() / 3)  // the text, and the floats it becomes
    throw InputError(where + ": " + std::to_string(size >> 20) + " MiB is more than the memory limit of " +
                     std::to_string(memory_cap() >> 20) + " MiB allows");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(where + ": cannot open: " + std::strerror(errno));
  std::string text(size_t(size), '\0');
  if (!f.read(text.data(), std::streamsize(size))) throw InputError(where + ": read error");
  return text;
}

struct Columns {
  std::vector<std::string> names;
  size_t label = 0;
  std::string cell(size_t j) const {  // "column 'x' (column 3)", counting from 0
    return "column '" + names[j] + "' (column " + std::to_string(j) + ")";
  }
};

// The header's names and the label column: a name, or a 0-based index no header name equals.
Columns columns(const Record& head, const std::string& label, const std::string& where) {
  Columns c;
  for (const std::string& n : head.cells) c.names.push_back(trim(n));
  for (size_t j = 0; j < c.names.size(); ++j)
    if (c.names[j].empty())
      throw InputError(where + ": column " + std::to_string(j) + " of the header (line " + std::to_string(head.line) +
                       ") has no name (pandas' to_csv writes its index so: write with index=False)");
  if (c.names.size() < 2) {
    const bool other = c.names[0].find_first_of(";\t") != std::string::npos;
    throw InputError(where + ": the header has one column, '" + c.names[0] + "'; a label and at least one feature "
                             "are needed" + (other ? " (columns separated by ';' or tabs? dpdata reads commas)" : ""));
  }
  std::vector<size_t> hits;
  for (size_t j = 0; j < c.names.size(); ++j)
    if (c.names[j] == label) hits.push_back(j);
  if (hits.size() > 1) throw InputError(where + ": " + std::to_string(hits.size()) + " columns are named '" + label + "'");
  if (hits.size() == 1) return c.label = hits[0], c;
  const bool digits = !label.empty() && label.find_first_not_of("0123456789") == std::string::npos;
  if (digits && label.size() < 10 && std::stoul(label) < c.names.size()) return c.label = std::stoul(label), c;
  std::string list;
  for (size_t j = 0; j < c.names.size() && j < 20; ++j) list += (j ? ", " : "") + c.names[j];
  throw InputError(where + ": no column named '" + label + "' for --label (the header has " + list +
                   (c.names.size() > 20 ? ", ..." : "") + ")");
}

float feature(const std::string& cell, const std::string& at) {
  const std::string t = trim(cell);
  if (t.empty()) throw InputError(at + ": empty cell; every column but the label is a feature and needs a number");
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) throw InputError(at + ": '" + t + "' is not a number");
  if (!std::isfinite(v)) throw InputError(at + ": '" + t + "' is not a finite number");
  if (std::fabs(v) > double(FLT_MAX)) throw InputError(at + ": " + t + " is beyond float32's range (3.4e38)");
  return float(v);
}

bool integer(const std::string& t, int64_t& v) {
  if (t.empty() || t.size() > 18 || t.find_first_not_of("+-0123456789") != std::string::npos) return false;
  char* end = nullptr;
  v = std::strtoll(t.c_str(), &end, 10);
  return end == t.c_str() + t.size();
}

bool number(const std::string& t) {
  char* end = nullptr;
  std::strtod(t.c_str(), &end);
  return !t.empty() && end == t.c_str() + t.size();
}

// Class names: numbered in sorted (byte) order, as torchvision numbers an image folder's
// classes; the names are kept (ds.class_names, written as the class_names attribute).
std::vector<int64_t> name_classes(const std::vector<std::string>& cells, const std::string& where, Dataset& ds,
                                  ImportOptions& o) {
  std::map<std::string, int64_t> index;
  for (const std::string& c : cells) index.emplace(c, 0);
  check_num_classes(where + ": the number of class names", double(index.size()));
  if (o.num_classes && size_t(*o.num_classes) < index.size())
    throw InputError(where + ": holds " + std::to_string(index.size()) + " class names but --num-classes is " +
                     std::to_string(*o.num_classes));
  std::string list;
  for (auto& [name, k] : index) {
    k = int64_t(ds.class_names.size());
    if (k < 20) list += (k ? ", " : "") + std::to_string(k) + " = " + name;
    ds.class_names.push_back(name);
  }
  check_class_names(where, ds.class_names);
  note(o, "labels are class names, numbered in sorted order: " + list + (index.size() > 20 ? ", ..." : ""));
  if (!o.num_classes) o.num_classes = int(index.size());
  std::vector<int64_t> raw;
  raw.reserve(cells.size());
  for (const std::string& c : cells) raw.push_back(index[c]);
  return raw;
}

// Integer labels when every label is an integer; class names when none is a number; else the
// first label that breaks the pattern is named.
void set_csv_labels(const std::vector<std::string>& cells, const std::vector<int64_t>& lines, const std::string& where,
            Dataset& ds, ImportOptions o) {
  const RowName line = [&](size_t i) { return "line " + std::to_string(lines[i]); };
  std::vector<int64_t> raw(cells.size());
  size_t first_other = cells.size(), first_number = cells.size();
  for (size_t i = 0; i < cells.size(); ++i) {
    if (cells[i].empty()) throw InputError(where + ": " + line(i) + ": empty label");
    const bool is_int = integer(cells[i], raw[i]);
    if (!is_int && first_other == cells.size()) first_other = i;
    if (number(cells[i]) && first_number == cells.size()) first_number = i;
  }
  if (first_other < cells.size() && first_number < cells.size()) {
    const size_t i = first_other;
    if (number(cells[i]))
      throw InputError(where + ": " + line(i) + ": label '" + cells[i] + "' is not an integer (labels are class "
                       "indices from 0, or class names)");
    throw InputError(where + ": " + line(i) + ": label '" + cells[i] + "' is a name but " + line(first_number) +
                     "'s label '" + cells[first_number] + "' is a number: the label column holds class indices or "
                     "class names, not both");
  }
  if (first_other < cells.size()) raw = name_classes(cells, where, ds, o);
  set_labels(ds, raw, where, line, o);
}

}  // namespace

Dataset import_csv(const std::string& path, const std::string& label, const ImportOptions& o) {
  const std::string where = "csv file '" + path + "'";
  const std::string text = read_text(path, where);
  CsvReader reader(text, where);
  Record r;
  if (!reader.next(r)) throw InputError(where + ": is empty (a header row and data rows are needed)");
  const Columns c = columns(r, label, where);
  Dataset ds;
  ds.path = path;
  ds.is_u8 = false;
  ds.dim = int64_t(c.names.size() - 1);
  ds.sample_shape = {ds.dim};
  std::vector<std::string> label_cells;
  std::vector<int64_t> lines;
  while (reader.next(r)) {
    if (r.cells.size() != c.names.size())
      throw InputError(where + ": line " + std::to_string(r.line) + " has " + std::to_string(r.cells.size()) +
                       " fields but the header has " + std::to_string(c.names.size()));
    const std::string at = where + ": line " + std::to_string(r.line) + ", ";
    for (size_t j = 0; j < r.cells.size(); ++j)
      if (j != c.label) ds.f32.push_back(feature(r.cells[j], at + c.cell(j)));
    label_cells.push_back(trim(r.cells[c.label]));
    lines.push_back(r.line);
  }
  if (lines.empty()) throw InputError(where + ": has a header but no data rows");
  ds.n = int64_t(lines.size());
  note(o, path + ": label " + c.cell(c.label) + ", " + std::to_string(ds.dim) + " feature columns");
  set_csv_labels(label_cells, lines, where + ": label " + c.cell(c.label), ds, o);
  return ds;
}

}  // namespace dpt
