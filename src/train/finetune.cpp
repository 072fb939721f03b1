// model.init's tensors onto a model, and the fine-tuning marks on its tensors (finetune.hpp).
#include "dpt/finetune.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "dpt/check.hpp"

namespace dpt {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// key == p, or key continues p at a dot ("layer1" covers "layer1.0.conv1.weight", not "layer10").
bool under(const std::string& key, const std::string& p) {
  return key == p || (key.size() > p.size() && key.compare(0, p.size(), p) == 0 && key[p.size()] == '.');
}

bool under_any(const std::string& key, const std::vector<std::string>& prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) { return under(key, p); });
}

std::string thousands(uint64_t n) {
  std::string s = std::to_string(n);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(size_t(i), ",");
  return s;
}

// One tensor the model expects: its key, shape, and where it goes.
struct Slot {
  std::string key;
  std::vector<int64_t> shape;
  int layer = -1;       // parameter: its layer slice
  bool weight = false;  // parameter: weight (else bias)
  int bn = -1;          // running statistic: its bn_states() index
  int stat = 0;         // 0 running_mean, 1 running_var, 2 num_batches_tracked
};

std::vector<Slot> model_slots(Model& m) {
  std::vector<Slot> out;
  for (int i = 0; i < m.num_layers(); ++i) {
    const LayerSlice& s = m.layer(i);
    out.push_back({s.name + ".weight", s.weight_shape(), i, true});
    if (s.has_bias) out.push_back({s.name + ".bias", {s.out}, i, false});
  }
  const std::vector<BnState> bn = m.bn_states();
  for (size_t j = 0; j < bn.size(); ++j) {
    const char* leaf[3] = {".running_mean", ".running_var", ".num_batches_tracked"};
    for (int k = 0; k < 3; ++k) {
      Slot sl{bn[j].name + leaf[k], k < 2 ? std::vector<int64_t>{bn[j].c} : std::vector<int64_t>{}};
      sl.bn = int(j), sl.stat = k;
      out.push_back(sl);
    }
  }
  return out;
}

// The slot's values from t (its shape already checked) into s.
void place(Model& m, const Slot& sl, const Tensor& t, HostModelState& s, const std::vector<size_t>& bn_at) {
  if (sl.layer >= 0) {
    const LayerSlice& ls = m.layer(sl.layer);
    if (sl.weight) weight_from_checkpoint(ls, t.data.data(), s.params.data() + ls.w_off);
    else std::copy(t.data.begin(), t.data.end(), s.params.begin() + long(ls.b_off));
    return;
  }
  const size_t c = size_t(m.bn_states()[size_t(sl.bn)].c);
  if (sl.stat == 2) {
    s.bn_tracked[size_t(sl.bn)] = t.int64 ? t.ints[0] : int64_t(t.data[0]);
    return;
  }
  std::copy(t.data.begin(), t.data.end(), s.bn_stats.begin() + long(bn_at[size_t(sl.bn)] + (sl.stat ? c : 0)));
}

// What is wrong with t as sl's tensor ("" = nothing).
std::string mismatch(const Slot& sl, const Tensor& t) {
  if (sl.stat == 2) return t.count() == 1 ? "" : "holds " + std::to_string(t.count()) + " values, not one count";
  if (t.int64) return "holds integers, not floating point";
  if (t.shape != sl.shape) return "the file's shape " + shape_str(t.shape) + ", the model's " + shape_str(sl.shape);
  return "";
}

}  // namespace

int head_layer(const Model& m) {
  for (int i = m.num_layers() - 1; i >= 0; --i)
    if (!m.layer(i).bn) return i;
  return -1;
}

std::vector<std::string> load_init_weights(Model& m, const Weights& w, const std::string& file,
                                           const std::string& skip, HostModelState& s) {
  const std::vector<std::string> skips = split_list(skip);
  std::map<std::string, const Tensor*> by_key;
  for (const Tensor& t : w.tensors) by_key[t.name] = &t;
  std::vector<size_t> bn_at;
  size_t at = 0;
  for (const BnState& b : m.bn_states()) bn_at.push_back(at), at += 2 * size_t(b.c);
  const int head = head_layer(m);
  std::vector<std::string> problems, reinit, skipped;
  std::set<std::string> used;
  uint64_t loaded_values = 0;
  size_t loaded = 0;
  for (const Slot& sl : model_slots(m)) {
    if (under_any(sl.key, skips)) {
      skipped.push_back(sl.key);
      used.insert(sl.key);
      continue;
    }
    auto it = by_key.find(sl.key);
    if (it == by_key.end()) {
      problems.push_back("no tensor '" + sl.key + "' (the model's " + shape_str(sl.shape) + ")");
      continue;
    }
    used.insert(sl.key);
    const std::string why = mismatch(sl, *it->second);
    if (why.empty()) {
      place(m, sl, *it->second, s, bn_at);
      ++loaded;
      if (sl.layer >= 0) loaded_values += it->second->count();
    } else if (sl.layer == head && head >= 0) {
      reinit.push_back(sl.key + " (" + why + ")");
    } else {
      problems.push_back("tensor '" + sl.key + "': " + why);
    }
  }
  for (const Tensor& t : w.tensors)
    if (!used.count(t.name) && !under_any(t.name, skips))
      problems.push_back("tensor '" + t.name + "' " + shape_str(t.shape) + " is not the model's");
  if (!problems.empty()) {
    std::string msg = "model.init " + file + " (" + w.kind + ") does not fit model.layers:";
    for (size_t i = 0; i < problems.size() && i < 12; ++i) msg += "\n  " + problems[i];
    if (problems.size() > 12) msg += "\n  ... and " + std::to_string(problems.size() - 12) + " more";
    msg += "\n(names are PyTorch state_dict keys, docs/models.md; leave tensors out with "
           "model.init_skip = PREFIX,...)";
    throw InputError(msg);
  }
  std::vector<std::string> lines;
  lines.push_back("model.init: " + file + " (" + w.kind + "): " + std::to_string(loaded) + " tensors loaded, " +
                  thousands(loaded_values) + " parameters" +
                  (m.bn_states().empty() ? "" : " and batch norm's running statistics"));
  auto join = [](const std::vector<std::string>& v) {
    std::string t;
    for (size_t i = 0; i < v.size(); ++i) t += (i ? ", " : "") + v[i];
    return t;
  };
  if (!reinit.empty()) lines.push_back("  the head re-initialised (seeded), its shape differs: " + join(reinit));
  if (!skipped.empty()) lines.push_back("  left seeded (model.init_skip): " + join(skipped));
  return lines;
}

FineTunePlan fine_tune_plan(const Model& m, const Config& cfg) {
  const std::vector<std::string> prefixes = split_list(cfg.freeze);
  const bool body = prefixes.size() == 1 && prefixes[0] == "body";
  const int head = head_layer(m);
  FineTunePlan plan;
  std::set<std::string> matched;
  for (int i = 0; i < m.num_layers(); ++i) {
    const LayerSlice& l = m.layer(i);
    bool whole = true;  // every tensor of the layer frozen
    for (int part = 0; part < 2; ++part) {
      if (part && !l.has_bias) continue;  // its slot (zeros) takes no update either way
      const std::string key = l.name + (part ? ".bias" : ".weight");
      TensorSeg seg = part ? TensorSeg{l.b_off, l.b_off + size_t(l.out), false}
                           : TensorSeg{l.w_off, l.w_off + l.weights(), !l.bn};
      bool in_set = body ? i != head : under_any(key, prefixes);
      for (const std::string& p : prefixes)
        if (under(key, p)) matched.insert(p);
      if (l.bn && cfg.train_bn) in_set = false;
      seg.frozen = in_set;
      seg.body = i != head && cfg.body_lr_scale != 1.0;
      if (in_set) plan.frozen.push_back(key);
      whole = whole && in_set;
      plan.tensors.push_back(seg);
    }
    plan.frozen_layers.push_back(whole ? 1 : 0);
  }
  for (const std::string& p : prefixes)
    if (!body && !matched.count(p))
      throw InputError("config error: train.freeze = '" + cfg.freeze + "': '" + p +
                       "' names no tensor of the model (names are PyTorch state_dict keys, e.g. " +
                       m.layer(0).name + ".weight; prefixes match at a dot)");
  std::sort(plan.tensors.begin(), plan.tensors.end(),
            [](const TensorSeg& a, const TensorSeg& b) { return a.begin < b.begin; });
  return plan;
}

}  // namespace dpt
