// dpdata: imports real datasets into the HDF5 layout of DESIGN.md, generates synthetic ones,
// and inspects and validates files. Serial: no MPI. Errors print "dpdata: <message>" and exit
// with the error's code (2 for bad input).
#include <boost/program_options.hpp>

#include <algorithm>
#include <cstdio>
#include <utility>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "dpt/check.hpp"
#include "dpt/version.hpp"
#include "dpt/data.hpp"

namespace po = boost::program_options;
using Args = std::vector<std::string>;

namespace {

// Parses a subcommand's arguments; prints its help and returns false on --help. Positional
// arguments beyond those `pos` names are refused by name (Boost would only say "too many").
bool parse(const std::string& usage, po::options_description& opts, const Args& args,
           po::variables_map& vm, const po::positional_options_description& pos = {}) {
  opts.add_options()("help,h", "show this help");
  po::options_description hidden, all;
  hidden.add_options()("stray-argument", po::value<std::vector<std::string>>());
  all.add(opts).add(hidden);
  po::positional_options_description with_stray = pos;
  with_stray.add("stray-argument", -1);
  try {
    po::store(po::command_line_parser(args).options(all).positional(with_stray).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: " << usage << "\n\n" << opts << "\n";
      return false;
    }
    if (vm.count("stray-argument"))
      throw dpt::InputError("unexpected argument '" + vm["stray-argument"].as<std::vector<std::string>>().front() +
                            "' (usage: " + usage + ")");
    po::notify(vm);
  } catch (const po::error& e) {
    throw dpt::InputError(std::string(e.what()) + " (usage: " + usage + ")");
  }
  return true;
}

void report_written(const std::string& path, const dpt::Dataset& ds) {
  std::printf("wrote %s: %lld rows x %lld features (%s), %d classes\n", path.c_str(),
              (long long)ds.n, (long long)ds.dim, ds.is_u8 ? "uint8" : "float32", ds.num_classes);
}

int cmd_import_idx(const Args& args) {
  std::string images, labels, out;
  po::options_description opts("import-idx options");
  opts.add_options()
      ("images", po::value(&images)->required(), "idx3 images file (.gz or plain)")
      ("labels", po::value(&labels)->required(), "idx1 labels file (.gz or plain)")
      ("out", po::value(&out)->required(), "output HDF5 file");
  po::variables_map vm;
  if (!parse("dpdata import-idx --images F --labels F --out OUT.h5", opts, args, vm)) return 0;
  const dpt::Dataset ds = dpt::import_idx(images, labels);
  dpt::write_dataset(out, ds);
  report_written(out, ds);
  return 0;
}

// Refuses an output path that names one of the inputs: the rename would replace it.
void check_not_an_input(const std::string& out, const std::vector<std::string>& inputs) {
  std::error_code ec;
  for (const std::string& in : inputs)
    if (std::filesystem::equivalent(out, in, ec))
      throw dpt::InputError("the output '" + out + "' is the input '" + in + "'; name a new .h5 file");
}

// Writes an imported dataset (temporary file + rename), reads it back through the loader's
// checks, and reports what was done.
int write_imported(const std::string& out, const dpt::Dataset& ds, const std::vector<std::string>& notes) {
  for (const std::string& line : notes) std::printf("%s\n", line.c_str());
  dpt::write_dataset(out, ds);
  dpt::probe_dataset(out);
  report_written(out, ds);
  return 0;
}

int cmd_npy(const Args& args) {
  std::string features, labels, out;
  int classes = 0;
  dpt::ImportOptions o;
  po::options_description opts("npy options (a NumPy pair, as np.save writes it)");
  opts.add_options()
      ("features", po::value(&features)->required(), "N x D or N x C x H x W array: uint8, float32 or float64")
      ("labels", po::value(&labels)->required(), "N integer labels: int8 to int64, uint8 to uint32")
      ("out", po::value(&out)->required(), "output HDF5 file")
      ("num-classes", po::value(&classes), "number of classes (default: the largest label + 1)")
      ("channels-last", po::bool_switch(&o.channels_last), "features are N x H x W x C: transpose them");
  po::positional_options_description pos;
  pos.add("features", 1).add("labels", 1).add("out", 1);
  po::variables_map vm;
  if (!parse("dpdata npy FEATURES.npy LABELS.npy OUT.h5 [--num-classes K] [--channels-last]", opts, args, vm, pos))
    return 0;
  if (vm.count("num-classes")) o.num_classes = classes;
  check_not_an_input(out, {features, labels});
  std::vector<std::string> notes;
  o.notes = &notes;
  return write_imported(out, dpt::import_npy(features, labels, o), notes);
}

int cmd_csv(const Args& args) {
  std::string file, out, label;
  int classes = 0;
  dpt::ImportOptions o;
  po::options_description opts("csv options (a header row; every column but the label is a feature)");
  opts.add_options()
      ("file", po::value(&file)->required(), "CSV file, comma-separated, with a header row")
      ("out", po::value(&out)->required(), "output HDF5 file")
      ("label", po::value(&label)->required(),
       "the label column: its header name, or its index from 0; integers or class names")
      ("num-classes", po::value(&classes), "number of classes (default: the largest label + 1, or the names)");
  po::positional_options_description pos;
  pos.add("file", 1).add("out", 1);
  po::variables_map vm;
  if (!parse("dpdata csv FILE.csv OUT.h5 --label COLUMN [--num-classes K]", opts, args, vm, pos)) return 0;
  if (vm.count("num-classes")) o.num_classes = classes;
  check_not_an_input(out, {file});
  std::vector<std::string> notes;
  o.notes = &notes;
  return write_imported(out, dpt::import_csv(file, label, o), notes);
}

// "3 classes: 0 cat, 1 dog, 2 fox", the first 20 of a longer list.
void print_classes(const dpt::ImageImportSummary& s) {
  std::string line;
  const int shown = std::min(s.num_classes, 20);
  for (int c = 0; c < shown; ++c)
    line += (c ? ", " : "") + std::to_string(c) + (s.classes[size_t(c)].empty() ? "" : " " + s.classes[size_t(c)]);
  if (shown < s.num_classes) line += ", ... (" + std::to_string(s.num_classes - shown) + " more)";
  std::printf("%d classes: %s\n", s.num_classes, line.c_str());
}

int cmd_images(const Args& args) {
  dpt::ImageImportOptions o;
  po::options_description opts("images options (JPEG and PNG photos to N x C x S x S uint8; docs/formats.md)");
  opts.add_options()
      ("folder", po::value(&o.folder), "image folder: DIR/<class>/<image>, as torchvision's ImageFolder")
      ("csv", po::value(&o.csv), "or a CSV file with the header path,label (a class name or index)")
      ("root", po::value(&o.root), "folder the CSV's paths are relative to (default: the CSV's folder)")
      ("out", po::value(&o.out)->required(), "output HDF5 file")
      ("size", po::value(&o.size)->default_value(256), "S: shorter side resized to S, then the center S x S")
      ("channels", po::value(&o.channels)->default_value(3), "3 (RGB) or 1 (gray, PIL's 'L')")
      ("val-fraction", po::value(&o.val_fraction), "a stratified share of each class into --val-out")
      ("seed", po::value(&o.seed)->default_value(1), "seed of the --val-fraction choice")
      ("val-folder", po::value(&o.val_folder), "a validation folder of the same classes, into --val-out")
      ("val-out", po::value(&o.val_out), "validation HDF5 file")
      ("threads", po::value(&o.threads)->default_value(0), "decoding threads (0: one per core)")
      ("strict", po::bool_switch(&o.strict), "stop at the first bad file (exit 2) instead of skipping it")
      ("report", po::value(&o.report), "where skipped files are listed (default: OUT.skipped.txt)")
      ("max-pixels", po::value(&o.max_pixels)->default_value(89478485),
       "refuse images with more pixels, from their header (PIL's limit)")
      ("exif-transpose", po::bool_switch(&o.exif_transpose),
       "turn JPEGs by their EXIF orientation (PIL's exif_transpose; torchvision does not)")
      ("full-decode", po::bool_switch(&o.full_decode),
       "decode JPEGs at full size, as PIL does (slower; without it libjpeg downscales by M/8)")
      ("store", po::value(&o.store)->default_value("raw"),
       "raw: the S x S pixels (/features); jpeg: each S x S image re-encoded as a JPEG (/jpeg, lossy, "
       "several times smaller), decoded when read")
      ("quality", po::value<int>(), "--store jpeg's JPEG quality, 1-100 (default 90; 4:2:0 chroma for RGB)")
      ("direct-io", po::value(&o.direct_io)->default_value("auto"),
       "auto: raw rows written with O_DIRECT where the file system takes it, else through the page "
       "cache; off: always through the page cache");
  po::variables_map vm;
  if (!parse("dpdata images (--folder DIR | --csv FILE [--root DIR]) --out OUT.h5 [--size S] [--channels 3|1] "
             "[--val-fraction F --val-out VAL.h5 [--seed N] | --val-folder DIR --val-out VAL.h5] [--threads N] "
             "[--strict] [--report FILE] [--max-pixels N] [--exif-transpose] [--full-decode] "
             "[--store raw|jpeg [--quality Q]] [--direct-io auto|off]",
             opts, args, vm))
    return 0;
  if (vm.count("quality")) o.quality = vm["quality"].as<int>();
  std::vector<std::string> inputs{o.csv};
  check_not_an_input(o.out, inputs);
  const dpt::ImageImportSummary s = dpt::import_images(o);
  print_classes(s);
  for (const auto& [path, rows] : {std::pair{o.out, s.train_rows}, std::pair{o.val_out, s.val_rows}}) {
    if (path.empty()) continue;
    const dpt::DatasetInfo info = dpt::probe_dataset(path);
    std::printf("wrote %s: %lld rows x %d x %d x %d (uint8), %d classes\n", path.c_str(), (long long)rows,
                o.channels, o.size, o.size, s.num_classes);
    if (info.encoding == "jpeg")
      std::printf("  stored as JPEG at quality %d: %.1f MB, %.1f KB per image (raw: %.1f KB)\n", o.quality.value_or(90),
                  double(info.stored_bytes) / 1e6, double(info.stored_bytes) / 1e3 / double(std::max<int64_t>(info.n, 1)),
                  double(info.dim) / 1e3);
  }
  std::printf("images: %lld in %.1f s, %.0f img/s\n", (long long)(s.train_rows + s.val_rows), s.seconds,
              double(s.train_rows + s.val_rows) / std::max(s.seconds, 1e-9));
  std::printf("  the writing thread: %.1f s writing (HDF5, flush and fsync), %.1f s waiting for decoded rows\n",
              s.write_seconds, s.wait_seconds);
  if (s.direct_bytes + s.cached_bytes > 0)
    std::printf("  pixels: %.1f MB written with O_DIRECT, %.1f MB through the page cache\n", double(s.direct_bytes) / 1e6,
                double(s.cached_bytes) / 1e6);
  if (s.skipped > 0 || s.problems > 0)
    std::printf("skipped %lld of %lld files%s: see %s\n", (long long)s.skipped, (long long)s.files,
                s.problems ? (" and reported " + std::to_string(s.problems) + " folder(s)").c_str() : "",
                s.report.c_str());
  return 0;
}

int cmd_fashion_mnist(const Args& args) {
  std::string dir, out_dir;
  po::options_description opts("fashion-mnist options");
  opts.add_options()
      ("dir", po::value(&dir)->default_value("/usr/share/datasets/fashion-mnist"),
       "directory with the four idx .gz files (Debian's dataset-fashion-mnist)")
      ("out-dir", po::value(&out_dir)->default_value("data"), "where the .h5 files go");
  po::variables_map vm;
  if (!parse("dpdata fashion-mnist [--dir D] [--out-dir D]", opts, args, vm)) return 0;
  std::filesystem::create_directories(out_dir);
  const struct { const char* prefix; const char* name; } parts[] = {
      {"train", "fashion-mnist-train.h5"}, {"t10k", "fashion-mnist-test.h5"}};
  for (const auto& p : parts) {
    const std::string base = dir + "/" + p.prefix;
    dpt::Dataset ds = dpt::import_idx(base + "-images-idx3-ubyte.gz", base + "-labels-idx1-ubyte.gz");
    // The dataset's own class names, as torchvision's FashionMNIST.classes lists them.
    ds.class_names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                      "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
    const std::string out = out_dir + "/" + p.name;
    dpt::write_dataset(out, ds);
    report_written(out, ds);
  }
  return 0;
}

int cmd_synth_odd_even(const Args& args) {
  int64_t n = 0;
  int bits = 0;
  uint64_t seed = 0;
  std::string out;
  po::options_description opts("synth odd-even options (label = parity of the bits)");
  opts.add_options()
      ("n", po::value(&n)->default_value(10000), "rows")
      ("bits", po::value(&bits)->default_value(8), "bits per row")
      ("seed", po::value(&seed)->default_value(1), "generator seed")
      ("out", po::value(&out)->required(), "output HDF5 file");
  po::variables_map vm;
  if (!parse("dpdata synth odd-even [--n N] [--bits B] [--seed S] --out F", opts, args, vm))
    return 0;
  const dpt::Dataset ds = dpt::synth_odd_even(n, bits, seed);
  dpt::write_dataset(out, ds);
  report_written(out, ds);
  return 0;
}

int cmd_synth_blobs(const Args& args) {
  int64_t n = 0;
  int dim = 0, classes = 0;
  float spread = 0;
  uint64_t seed = 0;
  std::string out;
  po::options_description opts("synth blobs options (Gaussian blobs around random centres)");
  opts.add_options()
      ("n", po::value(&n)->default_value(10000), "rows")
      ("dim", po::value(&dim)->default_value(32), "features per row")
      ("classes", po::value(&classes)->default_value(10), "number of blobs")
      ("spread", po::value(&spread)->default_value(0.5f), "standard deviation around a centre")
      ("seed", po::value(&seed)->default_value(1), "generator seed")
      ("out", po::value(&out)->required(), "output HDF5 file");
  po::variables_map vm;
  if (!parse("dpdata synth blobs [--n N] [--dim D] [--classes C] [--spread X] [--seed S] --out F",
             opts, args, vm))
    return 0;
  const dpt::Dataset ds = dpt::synth_blobs(n, dim, classes, spread, seed);
  dpt::write_dataset(out, ds);
  report_written(out, ds);
  return 0;
}

int cmd_synth(const Args& args) {
  const Args rest(args.empty() ? args.begin() : args.begin() + 1, args.end());
  if (!args.empty() && args[0] == "odd-even") return cmd_synth_odd_even(rest);
  if (!args.empty() && args[0] == "blobs") return cmd_synth_blobs(rest);
  const bool help = !args.empty() && (args[0] == "--help" || args[0] == "-h");
  if (!help && !args.empty()) std::cerr << "dpdata: synth: unknown kind '" << args[0] << "'\n";
  (help ? std::cout : std::cerr)
      << "usage: dpdata synth odd-even|blobs [options] --out F  (dpdata synth <kind> --help)\n";
  return help ? 0 : dpt::kExitUsage;
}

// One positional FILE argument, shared by info and validate.
bool parse_file(const char* usage, const Args& args, std::string& file) {
  po::options_description opts("options");
  opts.add_options()("file", po::value(&file)->required(), "dataset file (.h5)");
  po::positional_options_description pos;
  pos.add("file", 1);
  po::variables_map vm;
  return parse(usage, opts, args, vm, pos);
}

// One line per class (the first 100): index, rows, share, and its name when the file has class_names.
void print_histogram(const dpt::Dataset& ds) {
  std::vector<int64_t> count(size_t(ds.num_classes), 0);
  for (int32_t y : ds.labels) ++count[size_t(y)];
  const int shown = std::min(ds.num_classes, 100);
  std::printf("%8s %12s %9s%s\n", "class", "rows", "fraction", ds.class_names.empty() ? "" : "  name");
  for (int c = 0; c < shown; ++c)
    std::printf("%8d %12lld %8.2f%%%s%s\n", c, (long long)count[size_t(c)],
                100.0 * double(count[size_t(c)]) / double(ds.n), size_t(c) < ds.class_names.size() ? "  " : "",
                size_t(c) < ds.class_names.size() ? ds.class_names[size_t(c)].c_str() : "");
  if (shown < ds.num_classes) std::printf("  (%d more classes not shown)\n", ds.num_classes - shown);
}

int cmd_info(const Args& args) {
  std::string file;
  if (!parse_file("dpdata info FILE", args, file)) return 0;
  const dpt::DatasetInfo info = dpt::probe_dataset(file);
  const dpt::Dataset ds = dpt::load_dataset(file);
  std::string shape;
  for (int64_t s : info.sample_shape) shape += (shape.empty() ? "" : " x ") + std::to_string(s);
  std::printf("file          %s\n", file.c_str());
  std::printf("rows          %lld\n", (long long)info.n);
  std::printf("sample shape  %s (dim %lld)\n", shape.c_str(), (long long)info.dim);
  std::printf("features      %s, value = raw x %g + %g\n", info.feature_type.c_str(),
              double(info.scale), double(info.offset));
  std::printf("labels        %s, num_classes %d\n", info.label_type.c_str(), info.num_classes);
  if (info.encoding == "jpeg")
    std::printf("storage       pixels stored as JPEG (/jpeg, quality %s): %lld bytes, %.0f bytes per "
                "image (%.1fx smaller than raw)\n",
                info.jpeg_quality ? std::to_string(info.jpeg_quality).c_str() : "not recorded", (long long)info.stored_bytes, double(info.stored_bytes) / double(info.n),
                double(info.n) * double(info.dim) / double(std::max<int64_t>(info.stored_bytes, 1)));
  else
    std::printf("storage       raw (/features)\n");
  print_histogram(ds);
  return 0;
}

int cmd_validate(const Args& args) {
  std::string file;
  if (!parse_file("dpdata validate FILE", args, file)) return 0;
  try {
    const dpt::Dataset ds = dpt::load_dataset(file);
    std::printf("%s: valid (%lld rows, dim %lld, %d classes)\n", file.c_str(), (long long)ds.n,
                (long long)ds.dim, ds.num_classes);
    return 0;
  } catch (const dpt::Error& e) {  // any failure to load means "invalid", exit 2
    std::fprintf(stderr, "dpdata: %s\n", e.what());
    return dpt::kExitUsage;
  }
}

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const Args&);
};

const Command kCommands[] = {
    {"import-idx", "import MNIST-style idx files (--images, --labels, --out)", cmd_import_idx},
    {"fashion-mnist", "import Debian's Fashion-MNIST into <out-dir>/fashion-mnist-{train,test}.h5",
     cmd_fashion_mnist},
    {"npy", "import a NumPy pair: FEATURES.npy LABELS.npy OUT.h5 [--num-classes K]", cmd_npy},
    {"csv", "import a CSV file with a header row: FILE.csv OUT.h5 --label COLUMN", cmd_csv},
    {"images", "import JPEG/PNG photos: --folder DIR (ImageFolder) or --csv FILE, --out OUT.h5 [--size 256]",
     cmd_images},
    {"synth", "generate a synthetic dataset: odd-even (bit parity) or blobs", cmd_synth},
    {"info", "print rows, shape, types, scale/offset, class histogram of FILE", cmd_info},
    {"validate", "exit 0 if FILE loads, else print why and exit 2", cmd_validate},
};

void print_usage(std::FILE* to) {
  std::fprintf(to, "usage: dpdata <command> [options]   (dpdata <command> --help)\n\n");
  for (const Command& c : kCommands) std::fprintf(to, "  %-14s %s\n", c.name, c.summary);
}

int dispatch(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    print_usage(stdout);
    return 0;
  }
  if (cmd == "--version") {
    std::printf("%s\n", dpt::version_line("dpdata").c_str());
    return 0;
  }
  const Args rest(argv + std::min(argc, 2), argv + argc);
  for (const Command& c : kCommands)
    if (cmd == c.name) return c.run(rest);
  if (!cmd.empty()) std::fprintf(stderr, "dpdata: unknown command '%s'\n", cmd.c_str());
  print_usage(stderr);
  return dpt::kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return dispatch(argc, argv);
  } catch (const dpt::Error& e) {
    std::fprintf(stderr, "dpdata: %s\n", e.what());
    return e.code();
  } catch (const std::exception& e) {  // filesystem errors, bad_alloc
    std::fprintf(stderr, "dpdata: %s\n", e.what());
    return dpt::kExitRuntime;
  }
}
