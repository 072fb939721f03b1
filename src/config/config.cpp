#include "dpt/config.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "dpt/augment.hpp"
#include "dpt/check.hpp"
#include "dpt/layer_spec.hpp"
#include "dpt/nn.hpp"

namespace po = boost::program_options;

namespace dpt {
namespace {

std::string show(const std::string& v) { return v; }
std::string show(bool v) { return v ? "true" : "false"; }
std::string show(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}
// Doubles as a stream writes them (0.0005, 1e-08) where that text reads back to the same value,
// else in the shortest text that does: a changed lr is a changed value in the resolved
// configuration, however small the change.
std::string show(double v) {
  std::ostringstream os;
  os << v;
  if (std::strtod(os.str().c_str(), nullptr) == v) return os.str();
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
template <class T> std::string show(T v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// The one option table: every key's name, field, default (the field's initial value) and help.
class Table {
 public:
  po::options_description desc{"Configuration keys (INI section.key; every key also --section.key)"};
  std::vector<std::pair<std::string, std::function<std::string()>>> shown;

  template <class T> void add(const char* name, T* field, const char* help) {
    desc.add_options()(name, po::value<T>(field)->default_value(*field, show(*field)), help);
    shown.emplace_back(name, [field] { return show(*field); });
  }
};

// Keys whose text is parsed after Boost has read it (model.layers, model.input_shape).
struct TextKeys {
  std::string layers, input_shape;
  explicit TextKeys(const Config& c)
      : layers(c.layer_list.empty() ? show(c.layers) : c.layer_list), input_shape(show(c.input_shape)) {}
};

void build_table(Table& t, Config& c, TextKeys& k) {
  // Boost wraps the help column at 40 characters: each indented line below fits in it.
  t.add("model.layers", &k.layers,
        "MLP widths, input first (Linear layers, model.activation between them); or a layer "
        "list separated by spaces:\n"
        "  conv(C,K[,stride=S,pad=P,bias=false])\n"
        "  maxpool|avgpool(K[,stride=S,pad=P])\n"
        "  avgpool(global) linear(N) dropout(p)\n"
        "  relu tanh sigmoid gelu flatten\n"
        "  bn (batch norm)\n"
        "  res(body[ | shortcut]): residual\n"
        "    block, body(x) + shortcut(x)\n"
        "    (identity shortcut if omitted)\n"
        "e.g. conv(32,3,pad=1) bn relu maxpool(2) flatten linear(10). Or a preset, the whole "
        "list: resnet18, resnet34 or resnet50 (torchvision's), with optional arguments "
        "stem=small (a 3x3 stride-1 stem, no max pool, for 28x28 or 32x32 images) and "
        "classes=N:\n"
        "  resnet18(stem=small,classes=10)\n"
        "More: docs/models.md");
  t.add("model.activation", &c.activation, "relu | tanh | sigmoid | gelu (MLP widths only)");
  t.add("model.input_shape", &k.input_shape, "C,H,W of a flat dataset's samples (layer lists, augmentation)");
  t.add("model.init", &c.init,
        "weights to start from: a dptrain checkpoint, an HDF5 file with a /model group (e.g. "
        "from scripts/torch_to_h5.py) or a .safetensors file; torchvision's names for the "
        "presets (docs/models.md, Fine-tuning)");
  t.add("model.init_skip", &c.init_skip,
        "tensors of model.init left out (name prefixes, comma-separated, e.g. fc): they keep "
        "their seeded initialisation");
  t.add("model.sync_bn", &c.sync_bn,
        "batch norm's statistics over every rank's micro-batch (true) or each rank's own (false)");
  t.add("data.train", &c.train_file, "training set (HDF5, see README)");
  t.add("data.test", &c.test_file, "test set (HDF5), evaluated across all ranks");
  t.add("data.shuffle", &c.shuffle, "one permutation per epoch seeded by (seed, epoch)");
  t.add("data.read", &c.data_read,
        "all (every rank loads the files) | shard (only its rows, per epoch) | stream (only its "
        "coming micro-batches, data.stream_batches ahead)");
  t.add("data.stream_batches", &c.stream_batches,
        "data.read = stream: micro-batches a rank reads ahead of training (host memory: about this "
        "many + 2)");
  t.add("data.augment", &c.augment,
        "none | flip | crop | crop,flip | random_resized_crop | random_resized_crop,flip: per "
        "training sample, from (seed, epoch, row)");
  t.add("data.crop_padding", &c.crop_padding, "zero padding before a random crop (data.augment crop)");
  t.add("data.crop_size", &c.crop_size,
        "the model's input side: random_resized_crop's output, evaluation's center crop (0 = the "
        "stored size)");
  t.add("data.crop_scale", &c.crop_scale, "random_resized_crop: range of the window's area / the image's");
  t.add("data.crop_ratio", &c.crop_ratio, "random_resized_crop: range of the window's width / height");
  t.add("data.eval_crop_ratio", &c.eval_crop_ratio,
        "evaluation with data.crop_size: center window side / shorter side (0.875: Resize(256) + "
        "CenterCrop(224))");
  t.add("data.mean", &c.mean, "per-channel mean subtracted after scaling to [0, 1] (e.g. 0.485,0.456,0.406)");
  t.add("data.std", &c.std, "per-channel std divided by after data.mean (e.g. 0.229,0.224,0.225)");
  t.add("train.epochs", &c.epochs, "passes over the training set");
  t.add("train.steps", &c.steps, "cap on optimizer steps (0 = none)");
  t.add("train.batch_per_rank", &c.batch_per_rank, "samples per rank per micro-batch");
  t.add("train.optimizer", &c.optimizer, "sgd | momentum | nesterov | adam | adamw | lars | lamb");
  t.add("train.lr", &c.lr, "learning rate (before scaling)");
  t.add("train.momentum", &c.momentum, "momentum (momentum, nesterov)");
  t.add("train.weight_decay", &c.weight_decay, "L2 (sgd*, adam) or decoupled (adamw)");
  t.add("train.decay_bn_and_bias", &c.decay_bn_and_bias,
        "false: no weight decay on batch norm's parameters and biases (true: PyTorch's default)");
  t.add("train.label_smoothing", &c.label_smoothing, "cross-entropy label smoothing in [0, 1) (F.cross_entropy's)");
  t.add("train.beta1", &c.beta1, "Adam beta1");
  t.add("train.beta2", &c.beta2, "Adam beta2");
  t.add("train.eps", &c.eps, "Adam/LAMB epsilon");
  t.add("train.trust_coefficient", &c.trust_coefficient,
        "lars/lamb: trust ratio coefficient (0 = 0.001 for lars, 1 for lamb)");
  t.add("train.trust_clip", &c.trust_clip, "lars/lamb: largest trust ratio (0 = no clipping)");
  t.add("train.lr_scaling", &c.lr_scaling, "none | linear | sqrt (global batch / base_batch)");
  t.add("train.base_batch", &c.base_batch, "batch the lr was tuned for (0 = batch_per_rank)");
  t.add("train.warmup_steps", &c.warmup_steps, "linear warm-up steps");
  t.add("train.schedule", &c.schedule, "constant | step | cosine");
  t.add("train.step_every", &c.step_every, "schedule=step: steps between decays (0 = epoch)");
  t.add("train.step_gamma", &c.step_gamma, "schedule=step: decay factor");
  t.add("train.min_lr", &c.min_lr, "schedule=cosine: final learning rate");
  t.add("train.seed", &c.seed, "seed of initial weights and data order");
  t.add("train.sync", &c.sync, "gradients | parameters");
  t.add("train.average_every", &c.average_every, "sync=parameters: steps between averages");
  t.add("train.precision", &c.precision, "fp32 | tf32 | bf16 (cuda)");
  t.add("train.accumulate", &c.accumulate, "micro-batches per optimizer step");
  t.add("train.eval_every", &c.eval_every, "steps between evaluations (0 = each epoch)");
  t.add("train.on_nonfinite", &c.on_nonfinite, "stop | skip a step whose loss is NaN/Inf");
  t.add("train.freeze", &c.freeze,
        "parameters not trained: body (all but the head, the last linear layer) or name "
        "prefixes (comma-separated, e.g. conv1,bn1,layer1); empty = none");
  t.add("train.freeze_epochs", &c.freeze_epochs,
        "epochs at the start with train.freeze's tensors frozen, then they train at "
        "train.body_lr_scale x lr (0 = frozen the whole run)");
  t.add("train.body_lr_scale", &c.body_lr_scale,
        "learning rate of every tensor but the head's, as a fraction of the head's (fastai's "
        "discriminative rates)");
  t.add("train.train_bn", &c.train_bn,
        "batch norm's weight and bias train even where train.freeze covers them (fastai's "
        "default; false: frozen too)");
  t.add("train.shard_optimizer", &c.shard_optimizer,
        "ZeRO stage 1: each rank updates its shard (sync = gradients)");
  t.add("comm.backend", &c.comm_backend, "auto | nccl | mpi");
  t.add("comm.bucket_mb", &c.bucket_mb, "gradient bucket size in MB");
  t.add("comm.timeout_s", &c.timeout_s, "deadline of any blocking phase, seconds (exit 4 past it)");
  t.add("comm.grad_dtype", &c.grad_dtype, "fp32 | bf16: gradients on the wire (bf16 changes numerics)");
  t.add("comm.nccl_max_ctas", &c.nccl_max_ctas, "NCCL: most CTAs (SMs) per collective (0 = NCCL's choice)");
  t.add("device.type", &c.device_type, "auto | cuda | cpu");
  t.add("device.threads", &c.threads,
        "cpu: BLAS threads per rank (0 = from the CPU affinity mask, SLURM_CPUS_PER_TASK, "
        "OMP_NUM_THREADS / OPENBLAS_NUM_THREADS, in that order, else cores / ranks)");
  t.add("device.conv_tuning", &c.conv_tuning,
        "cuda: cuDNN convolution algorithms chosen by timing them at start-up (time) or by "
        "cuDNN's heuristic (heuristic: the same choice every run)");
  t.add("device.conv_workspace_mb", &c.conv_workspace_mb, "cuda: most cuDNN workspace per convolution, MB");
  t.add("device.recompute", &c.recompute,
        "auto | on | off: batch norms' ReLU outputs that only a convolution or pooling reads, made "
        "again in the backward pass instead of kept (less memory, one more pass over them; auto: "
        "on where they would hold 2^29 values or more)");
  t.add("checkpoint.dir", &c.ckpt_dir, "folder for checkpoints (empty = none)");
  t.add("checkpoint.every_steps", &c.ckpt_every, "steps between checkpoints (0 = end only)");
  t.add("checkpoint.keep", &c.ckpt_keep, "newest checkpoints kept (0 = all)");
  t.add("checkpoint.at_start", &c.ckpt_at_start, "write one before the first step");
  t.add("checkpoint.background", &c.ckpt_background,
        "write checkpoints on a thread of their own while training goes on (the model is copied "
        "off the device first; the run waits for the last write before it ends)");
  t.add("checkpoint.resume", &c.resume,
        "auto | none | <file>: auto continues the newest valid checkpoint in checkpoint.dir when it "
        "is this configuration's run (a changed key that alters what the run computes stops at "
        "start-up, naming it)");
  t.add("checkpoint.start_over", &c.start_over,
        "a fresh run moves another run's checkpoints in checkpoint.dir into a set-aside-<UTC "
        "time>/ subfolder (else it stops at start-up)");
  t.add("checkpoint.accept_changes", &c.accept_changes,
        "keys (comma-separated, e.g. train.lr,data.train) whose change from the resumed "
        "checkpoint's configuration this run accepts");
  t.add("log.metrics", &c.metrics_file, "metrics JSON Lines file (rank 0)");
  t.add("log.every_steps", &c.log_every, "steps between progress lines and metrics");
  t.add("log.progress", &c.progress, "print progress lines");
  t.add("log.timing", &c.timing, "print where the time went, phase by phase, at the end (rank 0)");
}

// Where a key's value came from: the command line overrides the file.
std::string origin(const std::string& key, const Config& c) {
  for (const std::string& k : c.cli_keys)
    if (k == key) return "the command line (--" + key + ")";
  return c.source;
}

[[noreturn]] void bad(const std::string& key, const std::string& value, const Config& c,
                      const std::string& why) {
  throw InputError("config error in " + origin(key, c) + ": " + key + " = '" + value + "': " + why);
}

void one_of(const std::string& key, const std::string& v, std::initializer_list<const char*> ok,
            const Config& c) {
  std::string list;
  for (const char* o : ok) {
    if (v == o) return;
    list += (list.empty() ? "" : " | ") + std::string(o);
  }
  bad(key, v, c, "expected " + list);
}

template <class T> void at_least(const std::string& key, T v, T lo, const Config& c) {
  if (!(v >= lo)) bad(key, show(v), c, "must be >= " + show(lo));
}

// Boost.Program_options builds its error messages by replacing placeholders such as %value%
// with the offending text, in a loop that never ends when that text holds the placeholder itself
// (found by fuzz/fuzz_config: `epochs = %value%x` hung every rank). No key or value needs a
// %word% pattern, so one is refused before Boost sees it.
void refuse_placeholders(const std::string& text, const std::string& where) {
  for (size_t a = text.find('%'); a != std::string::npos; a = text.find('%', a + 1)) {
    size_t b = a + 1;
    while (b < text.size() && (std::isalnum(static_cast<unsigned char>(text[b])) || text[b] == '_')) ++b;
    if (b < text.size() && b > a + 1 && text[b] == '%')
      throw InputError(where + ": '" + text.substr(a, b - a + 1) +
                       "' is not allowed (no key or value may hold text between two % signs)");
  }
}

// Words on the command line that are no option's (`dptrain inputs/run.ini`, stray words after
// a value) would otherwise be dropped without a word: an error naming them.
void refuse_positionals(const std::vector<std::string>& words) {
  if (words.empty()) return;
  std::string list;
  for (const std::string& w : words) list += (list.empty() ? "'" : ", '") + w + "'";
  std::string hint = " (every option is --name value; see --help)";
  std::error_code ec;
  if (std::filesystem::is_regular_file(words.front(), ec))
    hint = " ('" + words.front() + "' is a file: did you mean --config " + words.front() + "?)";
  throw InputError("command line error: unexpected argument" + std::string(words.size() > 1 ? "s " : " ") +
                   list + hint);
}

// model.layers (either form) and model.input_shape from their text.
void parse_model_keys(Config& c, const TextKeys& k, const po::variables_map& vm) {
  // Messages quote at most the start of a long value (a 1 MiB list is refused, not echoed).
  const std::string shown = k.layers.size() > 200 ? k.layers.substr(0, 200) + "..." : k.layers;
  try {
    if (is_layer_list(k.layers)) {
      c.layer_list = layer_list_text(parse_layer_list(k.layers));
      c.layers.clear();
    } else {
      c.layers = parse_layers(k.layers);
      c.layer_list.clear();
    }
  } catch (const InputError& e) {
    bad("model.layers", shown, c, e.what());
  }
  try {
    c.input_shape = parse_input_shape(k.input_shape);
  } catch (const InputError& e) {
    bad("model.input_shape", k.input_shape, c, e.what());
  }
  const auto act = vm.find("model.activation");
  if (!c.layer_list.empty() && act != vm.end() && !act->second.defaulted())
    bad("model.activation", c.activation, c,
        "model.activation belongs to the MLP widths form of model.layers; model.layers is a layer "
        "list here, where activations are layers of their own (e.g. 'linear(128) relu')");
}

}  // namespace

std::string find_config_path(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) return argv[i + 1];
    if (a.rfind("--config=", 0) == 0) return a.substr(9);
  }
  return "";
}

bool has_flag(int argc, const char* const* argv, const std::string& flag) {
  for (int i = 1; i < argc; ++i)
    if (flag == argv[i]) return true;
  return false;
}

Invocation parse_invocation(int argc, const char* const* argv, const std::string& ini_path,
                            const std::string& ini_text, bool check) {
  Invocation inv;
  Config& c = inv.cfg;
  c.source = ini_path.empty() ? "(command line)" : ini_path;
  TextKeys keys(c);
  Table t;
  build_table(t, c, keys);
  po::options_description generic("Usage: dptrain --config FILE [--section.key value ...]");
  std::string cfg_path;
  generic.add_options()("help,h", "print this help")("version", "print the version and exit")("config", po::value<std::string>(&cfg_path),
                                                     "INI file with the keys below")(
      "eval", "evaluate --checkpoint on data.test and exit")(
      "checkpoint", po::value<std::string>(&inv.eval_checkpoint), "checkpoint for --eval or --predict")(
      "predict", po::value<std::vector<std::string>>(&inv.predict)->multitoken(),
      "image files or folders (.jpg, .jpeg, .png) to classify with --checkpoint's model; writes "
      "--predictions")(
      "top-k", po::value<int>(&inv.top_k), "--predict: classes per image (default 5)")(
      "predictions", po::value<std::string>(&inv.predictions), "--predict: the CSV written (default predictions.csv)");
  po::options_description all;
  all.add(generic).add(t.desc);
  std::ostringstream help;
  help << all;
  inv.help_text = help.str();

  for (int i = 1; i < argc; ++i) refuse_placeholders(argv[i], "command line error");
  refuse_placeholders(ini_text, "config error in " + c.source);
  po::variables_map vm;
  try {  // command line first: po::store keeps the first value stored, so the CLI wins
    const po::parsed_options parsed = po::command_line_parser(argc, argv).options(all).run();
    refuse_positionals(po::collect_unrecognized(parsed.options, po::include_positional));
    po::store(parsed, vm);
    for (const auto& o : parsed.options)
      if (!o.string_key.empty()) c.cli_keys.push_back(o.string_key);
  } catch (const po::error& e) {
    throw InputError(std::string("command line error: ") + e.what() + " (see --help)");
  }
  if (!ini_text.empty()) {
    std::istringstream in(ini_text);
    try {
      po::store(po::parse_config_file(in, t.desc, false), vm);
    } catch (const po::error& e) {
      throw InputError("config error in " + ini_path + ": " + e.what());
    }
  }
  po::notify(vm);
  inv.help = vm.count("help") > 0;
  inv.version = vm.count("version") > 0;
  if (inv.version) return inv;
  inv.eval_only = vm.count("eval") > 0;
  if (!inv.predict.empty() && inv.eval_only)
    throw InputError("command line error: --eval and --predict are two runs: give one of them");
  if (inv.top_k < 1 || inv.top_k > 1000)
    throw InputError("command line error: --top-k " + std::to_string(inv.top_k) + ": must be in [1, 1000]");
  if (inv.help) return inv;
  parse_model_keys(c, keys, vm);
  if (check) validate(c);
  c.resolved = to_ini(c);
  return inv;
}

// train.freeze, freeze_epochs, body_lr_scale (below).
void validate_fine_tuning(const Config& c);

void validate(const Config& c) {
  one_of("data.read", c.data_read, {"all", "shard", "stream"}, c);
  if (c.stream_batches < 1 || c.stream_batches > 1024)
    bad("data.stream_batches", show(c.stream_batches), c, "must be in [1, 1024]");
  one_of("data.augment", c.augment,
         {"none", "flip", "crop", "crop,flip", "random_resized_crop", "random_resized_crop,flip"}, c);
  if (c.crop_padding < 0 || c.crop_padding > 64)
    bad("data.crop_padding", show(c.crop_padding), c, "must be in [0, 64]");
  try {
    parse_transform(c.augment, c.crop_size, c.crop_scale, c.crop_ratio, c.eval_crop_ratio, c.mean, c.std);
  } catch (const InputError& e) {
    // Each message starts with the key it is about.
    const std::string what = e.what();
    throw InputError("config error in " + origin(what.substr(0, what.find(' ')), c) + ": " + what);
  }
  one_of("model.activation", c.activation, {"relu", "tanh", "sigmoid", "gelu"}, c);
  one_of("train.optimizer", c.optimizer, {"sgd", "momentum", "nesterov", "adam", "adamw", "lars", "lamb"}, c);
  one_of("train.lr_scaling", c.lr_scaling, {"none", "linear", "sqrt"}, c);
  one_of("train.schedule", c.schedule, {"constant", "step", "cosine"}, c);
  one_of("train.sync", c.sync, {"gradients", "parameters"}, c);
  one_of("train.precision", c.precision, {"fp32", "tf32", "bf16"}, c);
  one_of("train.on_nonfinite", c.on_nonfinite, {"stop", "skip"}, c);
  one_of("comm.backend", c.comm_backend, {"auto", "nccl", "mpi"}, c);
  one_of("comm.grad_dtype", c.grad_dtype, {"fp32", "bf16"}, c);
  one_of("device.type", c.device_type, {"auto", "cuda", "cpu"}, c);
  one_of("device.conv_tuning", c.conv_tuning, {"time", "heuristic"}, c);
  one_of("device.recompute", c.recompute, {"auto", "on", "off"}, c);
  at_least("train.epochs", c.epochs, 1, c);
  at_least<int64_t>("train.steps", c.steps, 0, c);
  at_least("train.batch_per_rank", c.batch_per_rank, 1, c);
  if (c.batch_per_rank > (1 << 24)) bad("train.batch_per_rank", show(c.batch_per_rank), c, "too large");
  at_least("train.accumulate", c.accumulate, 1, c);
  if (c.accumulate > 65536) bad("train.accumulate", show(c.accumulate), c, "too large");
  at_least("train.average_every", c.average_every, 1, c);
  at_least("train.base_batch", c.base_batch, 0, c);
  at_least<int64_t>("train.warmup_steps", c.warmup_steps, 0, c);
  at_least<int64_t>("train.eval_every", c.eval_every, 0, c);
  at_least<int64_t>("train.step_every", c.step_every, 0, c);
  auto finite_pos = [&](const char* key, double v, bool allow_zero) {
    if (!std::isfinite(v) || v < 0 || (!allow_zero && v == 0)) bad(key, show(v), c, "must be a finite positive number");
  };
  finite_pos("train.lr", c.lr, false);
  finite_pos("train.weight_decay", c.weight_decay, true);
  finite_pos("train.min_lr", c.min_lr, true);
  finite_pos("train.eps", c.eps, false);
  finite_pos("train.trust_coefficient", c.trust_coefficient, true);
  finite_pos("train.trust_clip", c.trust_clip, true);
  if (!(c.label_smoothing >= 0 && c.label_smoothing < 1))
    bad("train.label_smoothing", show(c.label_smoothing), c, "must be in [0, 1)");
  if (!(c.momentum >= 0 && c.momentum < 1)) bad("train.momentum", show(c.momentum), c, "must be in [0, 1)");
  if (!(c.beta1 >= 0 && c.beta1 < 1)) bad("train.beta1", show(c.beta1), c, "must be in [0, 1)");
  if (!(c.beta2 >= 0 && c.beta2 < 1)) bad("train.beta2", show(c.beta2), c, "must be in [0, 1)");
  if (!(c.step_gamma > 0 && c.step_gamma <= 1)) bad("train.step_gamma", show(c.step_gamma), c, "must be in (0, 1]");
  if (!(c.bucket_mb > 0 && c.bucket_mb <= 4096)) bad("comm.bucket_mb", show(c.bucket_mb), c, "must be in (0, 4096]");
  if (!(c.timeout_s > 0 && c.timeout_s <= 1e6)) bad("comm.timeout_s", show(c.timeout_s), c, "must be in (0, 1e6]");
  at_least("device.threads", c.threads, 0, c);
  at_least("device.conv_workspace_mb", c.conv_workspace_mb, 0, c);
  at_least("comm.nccl_max_ctas", c.nccl_max_ctas, 0, c);
  if (c.nccl_max_ctas > 1024) bad("comm.nccl_max_ctas", show(c.nccl_max_ctas), c, "too large");
  if (c.shard_optimizer && c.sync == "parameters")
    bad("train.shard_optimizer", "true", c,
        "sharding the optimizer needs train.sync = gradients (with sync = parameters every rank "
        "keeps its own optimizer state)");
  if (c.grad_dtype == "bf16" && c.sync == "parameters")
    bad("comm.grad_dtype", c.grad_dtype, c, "gradients go on the wire only with train.sync = gradients");
  if (c.threads > 4096) bad("device.threads", show(c.threads), c, "too large");
  at_least<int64_t>("checkpoint.every_steps", c.ckpt_every, 0, c);
  at_least("checkpoint.keep", c.ckpt_keep, 0, c);
  at_least<int64_t>("log.every_steps", c.log_every, 1, c);
  if (c.optimizer == "nesterov" && c.momentum <= 0)
    bad("train.momentum", show(c.momentum), c, "nesterov needs momentum > 0");
  if (c.sync == "parameters" && c.ckpt_every > 0 && c.ckpt_every % c.average_every != 0)
    bad("checkpoint.every_steps", show(c.ckpt_every), c,
        "with sync = parameters it must be a multiple of train.average_every (" +
            show(c.average_every) + ") so every rank holds the same model when it is saved");
  if (c.precision != "fp32" && c.device_type == "cpu")
    bad("train.precision", c.precision, c, "tf32 and bf16 need device.type = cuda (or auto on a GPU)");
  if (c.start_over && c.resume != "auto" && c.resume != "none")
    bad("checkpoint.start_over", "true", c,
        "starting over and resuming from " + c.resume + " (checkpoint.resume) contradict each other");
  if (c.train_file.empty()) bad("data.train", "", c, "a training set is required");
  validate_fine_tuning(c);
  const auto keys = key_values(c);
  for (const std::string& k : split_list(c.accept_changes)) {
    const bool known = std::any_of(keys.begin(), keys.end(), [&](const auto& kv) { return kv.first == k; });
    if (!known)
      bad("checkpoint.accept_changes", c.accept_changes, c,
          "'" + k + "' is not a key (keys are section.name, as in --help: e.g. train.lr, data.train)");
  }
}

void validate_fine_tuning(const Config& c) {
  at_least("train.freeze_epochs", c.freeze_epochs, 0, c);
  if (c.freeze_epochs > 0 && c.freeze.empty())
    bad("train.freeze_epochs", show(c.freeze_epochs), c,
        "there is nothing to unfreeze: give train.freeze (e.g. body) as well");
  if (c.freeze_epochs > 0 && c.freeze_epochs >= c.epochs)
    bad("train.freeze_epochs", show(c.freeze_epochs), c,
        "must be fewer than train.epochs (" + show(c.epochs) + "): use train.freeze alone to keep them frozen");
  if (!std::isfinite(c.body_lr_scale) || c.body_lr_scale <= 0 || c.body_lr_scale > 1e6)
    bad("train.body_lr_scale", show(c.body_lr_scale), c, "must be a finite positive number");
  const bool groups = !c.freeze.empty() || c.body_lr_scale != 1.0;
  if (groups && (c.optimizer == "lars" || c.optimizer == "lamb"))
    bad(c.freeze.empty() ? "train.body_lr_scale" : "train.freeze", c.freeze.empty() ? show(c.body_lr_scale) : c.freeze, c,
        "frozen tensors and a body learning rate work with sgd, momentum, nesterov, adam and adamw, "
        "not with train.optimizer = " + c.optimizer);
  for (const std::string& p : split_list(c.freeze))
    if (p == "body" && split_list(c.freeze).size() > 1)
      bad("train.freeze", c.freeze, c, "body is the whole body already: give it alone or name prefixes");
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) {
    const size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    if (a != std::string::npos) out.push_back(item.substr(a, b - a + 1));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> key_values(const Config& cfg) {
  Config c = cfg;  // the table binds to fields; work on a copy
  TextKeys keys(c);
  Table t;
  build_table(t, c, keys);
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& [name, value] : t.shown) {
    // With a layer list the activation is not a key of the model: writing it would set it.
    if (name == "model.activation" && !c.layer_list.empty()) continue;
    out.emplace_back(name, value());
  }
  return out;
}

std::string to_ini(const Config& cfg) {
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> sections;
  std::vector<std::string> order;
  for (auto& [name, value] : key_values(cfg)) {
    auto dot = name.find('.');
    std::string sec = name.substr(0, dot);
    if (!sections.count(sec)) order.push_back(sec);
    sections[sec].emplace_back(name.substr(dot + 1), value);
  }
  std::ostringstream os;
  for (auto& sec : order) {
    os << "[" << sec << "]\n";
    for (auto& [k, v] : sections[sec]) os << k << " = " << v << "\n";
  }
  return os.str();
}

}  // namespace dpt
