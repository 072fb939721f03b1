// The trainer's inputs: the run's data read as data.read says (load_run_data), the shapes the
// model is planned for from it (resized crops included), and the passes that only read the
// model: evaluation and prediction.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <new>

#include "dpt/check.hpp"
#include "dpt/nn.hpp"
#include "dpt/timing.hpp"
#include "dpt/train.hpp"
#include "dpt/watchdog.hpp"
#include "train_internal.hpp"

namespace dpt {
using namespace train_detail;

RankOrder rank_order(const Config& cfg, const Comm& comm) {
  return rank_order(cfg, comm.rank(), comm.size());
}

RankOrder rank_order(const Config& cfg, int rank, int world) {
  RankOrder o;
  o.shuffle = cfg.shuffle;
  o.seed = cfg.seed;
  o.rank = rank;
  o.world = world;
  o.batch = cfg.batch_per_rank;
  o.accumulate = cfg.accumulate;
  return o;
}

RunData load_run_data(const Config& cfg, const Comm& comm, bool with_train) {
  return load_run_data(cfg, comm.rank(), comm.size(), with_train);
}

namespace {
// Reads a dataset into host memory; out of memory names the file, what it needs and the ways out
// rather than ending as a bare std::bad_alloc.
template <class F> auto in_host_memory(const char* key, const std::string& path, bool shard, F&& read) {
  try {
    return read();
  } catch (const std::bad_alloc&) {
    std::string size;
    try {
      const DatasetInfo in = probe_dataset(path);
      const double bytes = double(in.n) * double(in.dim) * (in.feature_type == "uint8" ? 1 : 4) + 4.0 * double(in.n);
      char buf[160];
      std::snprintf(buf, sizeof buf, " (%lld rows x %lld %s features: %.2f GiB)", static_cast<long long>(in.n),
                    static_cast<long long>(in.dim), in.feature_type.c_str(), bytes / double(1u << 30));
      size = buf;
    } catch (const std::exception&) {
    }
    throw Error(std::string("out of host memory reading ") + key + " " + path + size +
                (shard ? "" : "; with data.read = all every rank holds the whole file: data.read = shard holds only "
                              "the rows a rank trains on (an epoch at a time)") +
                "; or run fewer ranks per node, store features as uint8 (a quarter of float32), or ask the "
                "scheduler for more memory");
  }
}
}  // namespace

RunData load_run_data(const Config& cfg, int rank, int world, bool with_train) {
  RunData d;
  const bool shard = cfg.data_read == "shard" || cfg.data_read == "stream";
  const std::string& tr = cfg.train_file;
  if (with_train && cfg.data_read == "stream")
    d.rows = std::make_unique<TrainRows>(tr, rank_order(cfg, rank, world), cfg.stream_batches, int64_t(cfg.epochs));
  else if (with_train && shard)
    d.rows = in_host_memory("data.train", tr, shard, [&] { return std::make_unique<TrainRows>(tr, rank_order(cfg, rank, world)); });
  else if (with_train)
    d.train = in_host_memory("data.train", tr, shard, [&] { return load_dataset(tr); });
  d.has_test = !cfg.test_file.empty();
  const std::string& te = cfg.test_file;
  if (d.has_test)
    d.test = in_host_memory("data.test", te, shard,
                            [&] { return shard ? load_eval_shard(te, rank, world) : load_dataset(te); });
  return d;
}

std::unique_ptr<Trainer> make_trainer(const Config& cfg, Backend& be, Comm& comm, RunData& d) {
  const Dataset* test = d.has_test ? &d.test : nullptr;
  if (d.rows) return std::make_unique<Trainer>(cfg, be, comm, d.rows.get(), test);
  return std::make_unique<Trainer>(cfg, be, comm, d.train.n ? &d.train : nullptr, test);
}

namespace train_detail {

std::string widths_text(const std::vector<int64_t>& w) {
  std::string s;
  for (int64_t x : w) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// The MLP shorthand gives the input width first and the output width last; a user who wrote
// only the hidden and output widths, or widths for other data, is told which list to give.
void check_shape(const Config& cfg, const std::string& path, int64_t dim, int classes) {
  const std::vector<int64_t> w(cfg.layers.begin(), cfg.layers.end());
  const std::string key = path == cfg.train_file ? "data.train" : path == cfg.test_file ? "data.test" : "data";
  const std::string data = key + " (" + path + ")";
  std::vector<int64_t> fixed = w;
  fixed.back() = std::max<int64_t>(fixed.back(), classes);
  if (dim != w.front()) {
    std::vector<int64_t> prepended = fixed, replaced = fixed;
    prepended.insert(prepended.begin(), dim);
    replaced.front() = dim;
    throw InputError("model.layers = " + widths_text(w) + " starts with input width " + std::to_string(w.front()) +
                     ", but " + data + " has " + std::to_string(dim) + " features per row: give model.layers = " +
                     widths_text(prepended) + " (the first width is the input width), or " + widths_text(replaced) +
                     " if " + std::to_string(w.front()) + " was meant as the input width");
  }
  if (classes > w.back())
    throw InputError("model.layers = " + widths_text(w) + " ends with " + std::to_string(w.back()) + " outputs, but " +
                     data + " has " + std::to_string(classes) + " classes: give model.layers = " + widths_text(fixed) +
                     " (the last width is the number of outputs, at least num_classes)");
}

// The model cfg describes, on data whose samples have this shape (path names the data): the
// widths form checked against the data's width and classes; a layer list's shapes inferred.
ModelPlan model_plan(const Config& cfg, const std::vector<int64_t>& sample_shape, int64_t dim,
                     int classes, const std::string& path) {
  if (cfg.layer_list.empty()) {
    check_shape(cfg, path, dim, classes);
    return plan_model(mlp_layer_list(cfg.layers, parse_act(cfg.activation)), TensorShape::features(dim), 0);
  }
  try {
    return plan_model(parse_layer_list(cfg.layer_list), model_input_shape(sample_shape, cfg.input_shape, path),
                      classes);
  } catch (const InputError& e) {
    throw InputError("model.layers on " + path + ": " + e.what());
  }
}

// The training images' shape for data.augment: the model's input, else the data's (C, H, W),
// else model.input_shape.
TensorShape augment_shape(const Config& cfg, const ModelPlan& mp, const std::vector<int64_t>& sample_shape,
                          const std::string& path) {
  if (!mp.input.flat) return mp.input;
  if (sample_shape.size() == 3) return TensorShape::image(sample_shape[0], sample_shape[1], sample_shape[2]);
  if (!cfg.input_shape.empty()) return model_input_shape(sample_shape, cfg.input_shape, path);
  throw InputError("data.augment = " + cfg.augment + " needs images, but " + path +
                   " holds flat samples: set model.input_shape = C,H,W");
}
int64_t product(const std::vector<int64_t>& v) {
  int64_t d = 1;
  for (int64_t x : v) d *= x;
  return d;
}

// With resized crops (data.augment = random_resized_crop, data.crop_size, data.mean), the
// shape of the stored images (C, H, W: the data's, else model.input_shape's) into *stored, and
// the shape the model sees (C, crop, crop); else the data's own.
std::vector<int64_t> seen_shape(const ImageTransform& t, const Config& cfg, const std::vector<int64_t>& sample_shape,
                                const std::string& path, TensorShape* stored) {
  if (!t.any()) return sample_shape;
  TensorShape img;
  if (sample_shape.size() == 3) img = TensorShape::image(sample_shape[0], sample_shape[1], sample_shape[2]);
  else if (!cfg.input_shape.empty()) img = model_input_shape(sample_shape, cfg.input_shape, path);
  else
    throw InputError((t.random_crop ? "data.augment = " + cfg.augment : t.size ? std::string("data.crop_size")
                                                                                : std::string("data.mean")) +
                     " needs images, but " + path + " holds flat samples: set model.input_shape = C,H,W");
  if (!t.mean.empty() && int64_t(t.mean.size()) != img.c)
    throw InputError("data.mean and data.std have " + std::to_string(t.mean.size()) + " values, but the images of " +
                     path + " have " + std::to_string(img.c) + " channel(s) (" + img.str() + ")");
  if (img.h > kMaxImageSide || img.w > kMaxImageSide)
    throw InputError(path + " holds images of " + img.str() + ": resized crops take sides up to " +
                     std::to_string(kMaxImageSide));
  *stored = img;
  return {img.c, t.out_h(int(img.h)), t.out_w(int(img.w))};
}

}  // namespace train_detail

// Evaluation's window of ds's images (resized crops; img gets their stored shape), else 0.
int64_t Trainer::eval_window(const Dataset& ds, TensorShape& img) const {
  if (!xt_.data()) return 0;
  seen_shape(xform_, cfg_, ds.sample_shape, ds.path, &img);
  return center_window(xform_, int(img.h), int(img.w));
}

// Rows [first, first + n) of ds through evaluation's transform and the model: the logits.
const float* Trainer::eval_forward(const Dataset& ds, int64_t first, int n, std::vector<int64_t>& rows,
                                   const TensorShape& img, int64_t center) {
  for (int i = 0; i < n; ++i) rows[size_t(i)] = first + i;
  be_.load_batch(ds, rows.data(), n, x_.data(), y_.data());
  const float* x = x_.data();
  if (xt_.data()) {
    be_.resized_crop(x, xt_.data(), n, int(img.c), int(img.h), int(img.w), int(model_in_.h), int(model_in_.w),
                     nullptr, nullptr, 0, center, norm_.data());
    x = xt_.data();
  }
  return model_->forward(x, n);
}

EvalResult Trainer::evaluate(const Dataset& ds, bool per_class) {
  average_bn_stats();  // collective, as the evaluation is
  int64_t begin = 0, end = 0;
  eval_shard(ds.rows_in_file(), comm_.rank(), comm_.size(), begin, end);
  // A shard read alone (load_eval_shard) holds exactly these rows.
  if (begin < ds.first_row || end - ds.first_row > ds.n)
    throw Error(ds.path + ": rows [" + std::to_string(ds.first_row) + ", " +
                std::to_string(ds.first_row + ds.n) + ") held, but this rank evaluates [" +
                std::to_string(begin) + ", " + std::to_string(end) + ")");
  begin -= ds.first_row;
  end -= ds.first_row;
  const int chunk = model_->max_batch();
  std::vector<int64_t> rows(static_cast<size_t>(chunk));
  double sums[3] = {0, 0, double(end - begin)};
  // Each chunk's [Σ loss, #correct] goes to a slot of its own on the device, read back once at
  // the end and summed here in chunk order: the host never waits for the device between chunks.
  const size_t chunks = size_t((end - begin + chunk - 1) / chunk);
  if (eval_stats_.size() < 2 * chunks) eval_stats_ = Buffer<float>(be_, 2 * chunks);
  std::vector<float> host_stats(2 * chunks);
  TensorShape img;
  const int64_t center = eval_window(ds, img);
  // A big test set takes long in total but each chunk is bounded: the clock restarts per chunk.
  watchdog::Phase phase("evaluating", step_);
  timing::Scope timed(timing::Phase::eval);
  if (chunks) be_.fill(eval_stats_.data(), 2 * chunks, 0.f);
  // per_class: [rows of class c, correct of class c] for c < classes, from the logits on the host.
  const int classes = model_->classes();
  std::vector<double> per(per_class ? 2 * size_t(classes) : 0);
  std::vector<float> logits;
  size_t k = 0;
  for (int64_t r0 = begin; r0 < end; r0 += chunk, ++k, phase.restart()) {
    const int n = int(std::min<int64_t>(chunk, end - r0));
    const float* out = eval_forward(ds, r0, n, rows, img, center);
    if (per_class) {
      logits.resize(size_t(n) * size_t(classes));
      be_.download(logits.data(), out, logits.size() * sizeof(float));
      for (int i = 0; i < n; ++i) {
        const float* z = &logits[size_t(i) * size_t(classes)];
        const int32_t y = ds.labels[size_t(r0 + i)];
        if (y < 0 || y >= classes) continue;
        const int top = int(std::max_element(z, z + classes) - z);
        per[2 * size_t(y)] += 1;
        per[2 * size_t(y) + 1] += top == y;
      }
    }
    model_->loss(y_.data(), n, 0.f, eval_stats_.data() + 2 * k, false, false);
  }
  be_.download(host_stats.data(), eval_stats_.data(), host_stats.size() * sizeof(float));
  for (size_t i = 0; i < chunks; ++i) {
    sums[0] += host_stats[2 * i];
    sums[1] += host_stats[2 * i + 1];
  }
  host_sum(comm_.mpi(), sums, 3);
  EvalResult r;
  if (per_class) {
    host_sum(comm_.mpi(), per.data(), int(per.size()));
    for (int c = 0; c < classes; ++c) {
      r.class_rows.push_back(int64_t(per[2 * size_t(c)]));
      r.class_correct.push_back(int64_t(per[2 * size_t(c) + 1]));
    }
  }
  r.n = int64_t(sums[2]);
  r.loss = r.n ? sums[0] / double(r.n) : 0;
  r.accuracy = r.n ? sums[1] / double(r.n) : 0;
  return r;
}

std::vector<Prediction> Trainer::predict(const Dataset& ds, int top_k) {
  average_bn_stats();  // collective, as the prediction is
  const int classes = model_->classes();
  const int k = std::max(1, std::min(top_k, classes));
  const int chunk = model_->max_batch();
  std::vector<int64_t> rows(static_cast<size_t>(chunk));
  std::vector<float> logits;
  TensorShape img;
  const int64_t center = eval_window(ds, img);
  // This rank's rows: k (class, probability) pairs each, the most probable first.
  std::vector<int32_t> cls(size_t(ds.n) * size_t(k));
  std::vector<float> prob(size_t(ds.n) * size_t(k));
  watchdog::Phase phase("predicting", step_);
  std::vector<int> order(static_cast<size_t>(classes));
  for (int64_t r0 = 0; r0 < ds.n; r0 += chunk, phase.restart()) {
    const int n = int(std::min<int64_t>(chunk, ds.n - r0));
    const float* out = eval_forward(ds, r0, n, rows, img, center);
    logits.resize(size_t(n) * size_t(classes));
    be_.download(logits.data(), out, logits.size() * sizeof(float));
    for (int i = 0; i < n; ++i) {
      const float* z = &logits[size_t(i) * size_t(classes)];
      double mx = z[0], sum = 0;
      for (int c = 1; c < classes; ++c) mx = std::max(mx, double(z[c]));
      for (int c = 0; c < classes; ++c) sum += std::exp(double(z[c]) - mx);
      for (int c = 0; c < classes; ++c) order[size_t(c)] = c;
      // The k largest logits, ties to the lower class index.
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int a, int b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
      for (int j = 0; j < k; ++j) {
        const size_t at = size_t(r0 + i) * size_t(k) + size_t(j);
        cls[at] = order[size_t(j)];
        prob[at] = float(std::exp(double(z[order[size_t(j)]]) - mx) / sum);
      }
    }
  }
  // Rank 0 gathers every rank's rows, in file order (ranks hold consecutive shards).
  const int W = comm_.size();
  std::vector<int> counts(static_cast<size_t>(W)), displs(static_cast<size_t>(W));
  int mine = int(cls.size());
  {
    watchdog::Phase wait("gathering predictions");
    DPT_CHECK_MPI(MPI_Gather(&mine, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm_.mpi()));
  }
  int total = 0;
  for (int r = 0; r < W; ++r) {
    displs[size_t(r)] = total;
    total += counts[size_t(r)];
  }
  std::vector<int32_t> all_cls(comm_.rank() == 0 ? size_t(total) : 0);
  std::vector<float> all_prob(all_cls.size());
  DPT_CHECK_MPI(MPI_Gatherv(cls.data(), mine, MPI_INT32_T, all_cls.data(), counts.data(), displs.data(), MPI_INT32_T, 0,
                            comm_.mpi()));
  DPT_CHECK_MPI(MPI_Gatherv(prob.data(), mine, MPI_FLOAT, all_prob.data(), counts.data(), displs.data(), MPI_FLOAT, 0,
                            comm_.mpi()));
  std::vector<Prediction> res(size_t(total / k));
  for (size_t r = 0; r < res.size(); ++r)
    for (int j = 0; j < k; ++j) {
      res[r].classes.push_back(all_cls[r * size_t(k) + size_t(j)]);
      res[r].probs.push_back(all_prob[r * size_t(k) + size_t(j)]);
    }
  return res;
}

}  // namespace dpt
