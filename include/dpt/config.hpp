// The configuration: every option declared once (Boost.Program_options) for the INI file, the
// command line and --help, and validated with messages naming the key, the value and the file.
// Knows nothing of training; other layers read the plain Config struct.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dpt {

struct Checkpoint;  // ckpt.hpp

struct Config {
  // [model]
  // model.layers is either the MLP shorthand (widths, input first, with `activation` between
  // the Linear layers) or a layer list (layer_spec.hpp), held normalised in layer_list; exactly
  // one of `layers` and `layer_list` is non-empty after parsing.
  std::vector<int> layers{784, 256, 128, 10};
  std::string layer_list;           // "" = the MLP shorthand in `layers`
  std::string activation = "relu";  // relu|tanh|sigmoid|gelu (MLP shorthand only)
  std::vector<int> input_shape;     // model.input_shape C,H,W of a flat dataset ({} = from the data)
  std::string init;                 // weights to start from ("" = random init; weights.hpp)
  std::string init_skip;            // name prefixes of model.init's tensors not loaded (comma-separated)
  bool sync_bn = false;             // batch norm's statistics over every rank's micro-batch
  // [data]
  std::string train_file;
  std::string test_file;
  bool shuffle = true;
  std::string data_read = "all";  // all | shard | stream
  int stream_batches = 8;         // data.read = stream: micro-batches read ahead per rank
  std::string augment = "none";   // none | flip | crop | crop,flip | random_resized_crop[,flip] (training)
  int crop_padding = 4;           // zero padding around the image before a random crop
  // Resized crops (augment.hpp's ImageTransform): the model's input side (0 = the stored size),
  // random_resized_crop's area and aspect ranges, evaluation's center window / shorter side, and
  // per-channel normalisation (comma-separated; "" = none).
  int crop_size = 0;
  std::string crop_scale = "0.08,1";
  std::string crop_ratio = "0.75,1.3333333333333333";
  double eval_crop_ratio = 0.875;
  std::string mean, std;
  // [train]
  int epochs = 1;
  int64_t steps = 0;  // optional cap on optimizer steps (0 = none)
  int batch_per_rank = 64;
  std::string optimizer = "sgd";  // sgd|momentum|nesterov|adam|adamw|lars|lamb
  double lr = 0.01;
  double momentum = 0.9;
  double weight_decay = 0.0;
  bool decay_bn_and_bias = true;    // false: no weight decay on batch norm's parameters and biases
  double label_smoothing = 0.0;     // F.cross_entropy's label_smoothing
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double trust_coefficient = 0;  // lars|lamb: η (0 = the optimizer's default: 0.001, 1)
  double trust_clip = 0;         // lars|lamb: upper bound of the trust ratio (0 = none)
  std::string lr_scaling = "none";  // none|linear|sqrt
  int base_batch = 0;               // 0 = batch_per_rank (scale 1 on one rank)
  int64_t warmup_steps = 0;
  std::string schedule = "constant";  // constant|step|cosine
  int64_t step_every = 0;             // schedule=step: decay every N steps (0 = each epoch)
  double step_gamma = 0.1;            // schedule=step: factor
  double min_lr = 0.0;                // schedule=cosine: floor
  uint64_t seed = 1;
  std::string sync = "gradients";  // gradients|parameters
  int average_every = 1;
  std::string precision = "fp32";  // fp32|tf32|bf16
  int accumulate = 1;
  int64_t eval_every = 0;                 // steps between evaluations (0 = end of each epoch)
  std::string on_nonfinite = "stop";      // stop|skip
  bool shard_optimizer = false;           // ZeRO stage 1: optimizer state sharded over ranks
  // Fine-tuning (finetune.hpp): tensors not trained (body | name prefixes), for the first
  // freeze_epochs epochs only when > 0; every tensor but the head's at body_lr_scale × lr;
  // batch norm's weight and bias trained inside the frozen set (train_bn, fastai's default).
  std::string freeze;
  int freeze_epochs = 0;
  double body_lr_scale = 1.0;
  bool train_bn = true;
  // [comm]
  std::string comm_backend = "auto";  // auto|nccl|mpi
  double bucket_mb = 25.0;
  double timeout_s = 300.0;
  std::string grad_dtype = "fp32";  // fp32|bf16: gradients on the wire
  int nccl_max_ctas = 0;            // NCCL's CTA (SM) limit per collective (0 = NCCL's default)
  // [device]
  std::string device_type = "auto";  // auto|cuda|cpu
  int threads = 0;                   // BLAS threads per rank on the CPU (0 = cores / local ranks)
  std::string conv_tuning = "time";  // time|heuristic: how cuDNN's convolution algorithms are chosen
  std::string recompute = "auto";    // auto|on|off: batch norms' ReLU outputs made again in the backward pass
  int conv_workspace_mb = 1024;      // cuDNN: the most workspace one convolution may take
  // [checkpoint]
  std::string ckpt_dir;  // "" = no checkpoints
  int64_t ckpt_every = 0;
  int ckpt_keep = 3;
  bool ckpt_at_start = false;
  bool ckpt_background = true;  // the file written on a thread of its own while the steps go on
  std::string resume = "auto";  // auto|none|<file>
  bool start_over = false;      // a fresh run sets the folder's old checkpoints aside
  std::string accept_changes;   // keys whose change a resumed run accepts (comma-separated)
  // [log]
  std::string metrics_file;
  int64_t log_every = 50;
  bool progress = true;
  bool timing = false;  // rank 0 prints where the run's time went, phase by phase, at the end

  // Where it came from, for messages and the checkpoint's `config` attribute.
  std::string source;    // the INI path, or "(command line)"
  std::vector<std::string> cli_keys;  // keys given on the command line (they override the file)
  std::string resolved;  // the resolved configuration as INI text

  // Decided at start-up by plan_resume (resume.hpp), not keys. planned = false (a Trainer made
  // without it, as tests and benchmarks do): the Trainer finds checkpoint.resume itself.
  bool resume_planned = false;
  std::string resume_path;     // the checkpoint this run continues ("" = a fresh run)
  std::shared_ptr<Checkpoint> resume_checkpoint;  // rank 0: that file, read once (the Trainer takes it)
  std::vector<std::string> resume_notes;  // rank 0: what changed since it and goes on, a line each
  std::string data_identity;   // data.train's identity (data_identity()), stored in checkpoints
  int64_t schedule_steps = 0;  // the lr schedule's horizon in steps (0 = this run's last step)
};

// Command-line actions besides training.
struct Invocation {
  Config cfg;
  bool help = false;
  bool eval_only = false;        // --eval --checkpoint FILE [--data.test FILE]
  bool version = false;          // --version
  std::string eval_checkpoint;
  // --predict PATH... --checkpoint FILE [--top-k K] [--predictions OUT.csv]: classes of image
  // files (or the images in folders) written to a CSV.
  std::vector<std::string> predict;
  int top_k = 5;
  std::string predictions = "predictions.csv";
  std::string help_text;
};

// Parse `--config FILE` (its text read on rank 0 and passed in as ini_text) and overrides.
// Throws InputError naming key, value and file. Pure: no MPI, no I/O except nothing.
// check = false skips validation (--eval: the checkpoint's own config is parsed and checked next).
Invocation parse_invocation(int argc, const char* const* argv, const std::string& ini_path,
                            const std::string& ini_text, bool check = true);

// True when argv holds the flag (e.g. "--eval"), found before the full parse.
bool has_flag(int argc, const char* const* argv, const std::string& flag);

// The value of --config in argv ("" if absent), found before the full parse so rank 0 can read it.
std::string find_config_path(int argc, const char* const* argv);

// "a, b,c" -> {"a", "b", "c"} (blank items dropped).
std::vector<std::string> split_list(const std::string& text);

// Checks across keys (impossible combinations); throws InputError.
void validate(const Config& cfg);

// Resolved configuration as INI text (sorted by section), printed at start-up and stored in
// checkpoints.
std::string to_ini(const Config& cfg);
// The same as (dotted key, value text) pairs in the table's order: what a resumed run compares.
std::vector<std::pair<std::string, std::string>> key_values(const Config& cfg);

}  // namespace dpt
