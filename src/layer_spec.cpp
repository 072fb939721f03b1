#include "dpt/layer_spec.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "dpt/check.hpp"

namespace dpt {
namespace {

constexpr int64_t kMaxSampleElems = (int64_t(1) << 31) - 1;  // one sample's tensor, any layer
constexpr int64_t kMaxParams = int64_t(1) << 34;             // 64 GiB of fp32 weights
constexpr int kMaxWidth = 1 << 20;                           // conv channels, linear features
constexpr int kMaxKernel = 64, kMaxStride = 64, kMaxPad = 64;

const char* kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::conv: return "conv";
    case LayerKind::maxpool: return "maxpool";
    case LayerKind::avgpool: return "avgpool";
    case LayerKind::flatten: return "flatten";
    case LayerKind::linear: return "linear";
    case LayerKind::dropout: return "dropout";
    default: return "act";
  }
}

const char* act_text(Act a) {  // parse_act lives with the backends; this file stands alone
  switch (a) {
    case Act::relu: return "relu";
    case Act::tanh: return "tanh";
    case Act::sigmoid: return "sigmoid";
    case Act::gelu: return "gelu";
    default: return "none";
  }
}

// Shortest text that reads back as the same double.
std::string shortest(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

// One token of the list as written, for messages: "layer 3 'conv(32,x)'".
struct Token {
  std::string name, args, text;
  bool parens = false;
  int index = 0;  // 1-based
};

[[noreturn]] void bad_layer(const Token& t, const std::string& why) {
  throw InputError("layer " + std::to_string(t.index) + " '" + t.text + "': " + why);
}

// Splits the list into name(args) tokens; whitespace separates layers and may appear inside
// the parentheses.
std::vector<Token> tokenize(const std::string& s) {
  std::vector<Token> out;
  size_t i = 0;
  while (true) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    if (i == s.size()) break;
    Token t;
    t.index = int(out.size()) + 1;
    const size_t start = i;
    while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
    t.name = s.substr(start, i - start);
    size_t j = i;
    while (j < s.size() && std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    if (j < s.size() && s[j] == '(') {
      const size_t close = s.find(')', j);
      if (close == std::string::npos) {
        t.text = s.substr(start, std::min<size_t>(40, s.size() - start));
        bad_layer(t, "'(' without a closing ')'");
      }
      t.parens = true;
      t.args = s.substr(j + 1, close - j - 1);
      i = close + 1;
    }
    t.text = s.substr(start, i - start);
    if (t.name.empty()) {
      t.text = s.substr(start, std::min<size_t>(40, s.size() - start));
      bad_layer(t, "expected a layer name (conv, maxpool, avgpool, relu, tanh, sigmoid, gelu, "
                   "flatten, linear, dropout)");
    }
    if (i < s.size() && !std::isspace(static_cast<unsigned char>(s[i]))) {
      t.text = s.substr(start, std::min<size_t>(40, s.size() - start));
      bad_layer(t, "layers are separated by whitespace");
    }
    out.push_back(std::move(t));
    if (out.size() > kMaxListLayers)
      throw InputError("more than " + std::to_string(kMaxListLayers) + " layers");
  }
  return out;
}

// The arguments of one token: positional first, then name=value.
struct Args {
  std::vector<std::string> pos;
  std::vector<std::pair<std::string, std::string>> kw;
};

Args split_args(const Token& t) {
  Args a;
  if (!t.parens) return a;
  if (trim(t.args).empty()) return a;
  std::stringstream in(t.args);
  std::string part;
  while (std::getline(in, part, ',')) {
    part = trim(part);
    if (part.empty()) bad_layer(t, "empty argument");
    const size_t eq = part.find('=');
    if (eq == std::string::npos) {
      if (!a.kw.empty()) bad_layer(t, "positional argument '" + part + "' after a named one");
      a.pos.push_back(part);
    } else {
      a.kw.emplace_back(trim(part.substr(0, eq)), trim(part.substr(eq + 1)));
    }
  }
  if (t.args.back() == ',' || trim(t.args).back() == ',') bad_layer(t, "empty argument");
  return a;
}

int int_arg(const Token& t, const std::string& what, const std::string& v, int lo, int hi) {
  int x = 0;
  const auto r = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || r.ec != std::errc() || r.ptr != v.data() + v.size() || x < lo || x > hi)
    bad_layer(t, what + " '" + v + "' is not an integer in [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "]");
  return x;
}

// Reads the positional count and the named arguments a layer accepts.
void expect_args(const Token& t, const Args& a, size_t min_pos, size_t max_pos,
                 std::initializer_list<const char*> names, const char* usage) {
  if (a.pos.size() < min_pos || a.pos.size() > max_pos)
    bad_layer(t, std::string("expected ") + usage);
  for (size_t i = 0; i < a.kw.size(); ++i) {
    bool known = false;
    for (const char* n : names) known |= a.kw[i].first == n;
    if (!known) bad_layer(t, "unknown argument '" + a.kw[i].first + "' (expected " + usage + ")");
    for (size_t j = 0; j < i; ++j)
      if (a.kw[j].first == a.kw[i].first) bad_layer(t, "argument '" + a.kw[i].first + "' given twice");
  }
}

const std::string* named(const Args& a, const char* n) {
  for (auto& kv : a.kw)
    if (kv.first == n) return &kv.second;
  return nullptr;
}

LayerSpec parse_token(const Token& t) {
  const Args a = split_args(t);
  LayerSpec l;
  const std::string& n = t.name;
  if (n == "conv") {
    expect_args(t, a, 2, 2, {"stride", "pad"}, "conv(C_out, K[, stride=S][, pad=P])");
    l.kind = LayerKind::conv;
    l.out = int_arg(t, "C_out", a.pos[0], 1, kMaxWidth);
    l.k = int_arg(t, "kernel size", a.pos[1], 1, kMaxKernel);
    if (auto* s = named(a, "stride")) l.stride = int_arg(t, "stride", *s, 1, kMaxStride);
    if (auto* p = named(a, "pad")) l.pad = int_arg(t, "pad", *p, 0, kMaxPad);
  } else if (n == "maxpool" || n == "avgpool") {
    expect_args(t, a, 1, 1, {"stride"}, (n + "(K[, stride=S])").c_str());
    l.kind = n == "maxpool" ? LayerKind::maxpool : LayerKind::avgpool;
    l.k = int_arg(t, "kernel size", a.pos[0], 1, kMaxKernel);
    l.stride = l.k;
    if (auto* s = named(a, "stride")) l.stride = int_arg(t, "stride", *s, 1, kMaxStride);
  } else if (n == "relu" || n == "tanh" || n == "sigmoid" || n == "gelu" || n == "flatten") {
    if (!a.pos.empty() || !a.kw.empty()) bad_layer(t, n + " takes no arguments");
    l.kind = n == "flatten" ? LayerKind::flatten : LayerKind::act;
    l.act = n == "relu" ? Act::relu : n == "tanh" ? Act::tanh : n == "sigmoid" ? Act::sigmoid
          : n == "gelu" ? Act::gelu : Act::none;
  } else if (n == "linear") {
    expect_args(t, a, 1, 1, {}, "linear(N)");
    l.kind = LayerKind::linear;
    l.out = int_arg(t, "N", a.pos[0], 1, kMaxWidth);
  } else if (n == "dropout") {
    expect_args(t, a, 1, 1, {}, "dropout(p) with p in [0, 1)");
    l.kind = LayerKind::dropout;
    const std::string& v = a.pos[0];
    char* end = nullptr;
    l.p = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(l.p) || l.p < 0 || l.p >= 1)
      bad_layer(t, "p '" + v + "' is not a number in [0, 1)");
  } else {
    bad_layer(t, "unknown layer '" + n + "' (conv, maxpool, avgpool, relu, tanh, sigmoid, gelu, "
                 "flatten, linear, dropout)");
  }
  return l;
}

[[noreturn]] void bad_shape(size_t i, const LayerSpec& l, const TensorShape& in, const std::string& why) {
  throw InputError("layer " + std::to_string(i + 1) + " '" + l.text() + "' (input " + in.str() +
                   "): " + why);
}

int64_t conv_out(int64_t in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }

}  // namespace

std::string LayerSpec::text() const {
  switch (kind) {
    case LayerKind::conv:
      return "conv(" + std::to_string(out) + "," + std::to_string(k) + ",stride=" +
             std::to_string(stride) + ",pad=" + std::to_string(pad) + ")";
    case LayerKind::maxpool:
    case LayerKind::avgpool:
      return std::string(kind_name(kind)) + "(" + std::to_string(k) + ",stride=" + std::to_string(stride) + ")";
    case LayerKind::act: return act_text(act);
    case LayerKind::flatten: return "flatten";
    case LayerKind::linear: return "linear(" + std::to_string(out) + ")";
    case LayerKind::dropout: return "dropout(" + shortest(p) + ")";
  }
  return "?";
}

bool LayerSpec::operator==(const LayerSpec& o) const {
  return kind == o.kind && out == o.out && k == o.k && stride == o.stride && pad == o.pad &&
         act == o.act && p == o.p;
}

std::string TensorShape::str() const {
  if (flat) return std::to_string(c);
  return std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w);
}

bool is_layer_list(const std::string& text) {
  for (char ch : text)
    if (std::isalpha(static_cast<unsigned char>(ch))) return true;
  return false;
}

std::vector<LayerSpec> parse_layer_list(const std::string& text) {
  if (text.size() > kMaxLayerListChars)
    throw InputError("the layer list is " + std::to_string(text.size()) + " characters long (at most " +
                     std::to_string(kMaxLayerListChars) + ")");
  std::vector<LayerSpec> out;
  for (const Token& t : tokenize(text)) out.push_back(parse_token(t));
  if (out.empty()) throw InputError("the layer list is empty");
  return out;
}

std::string layer_list_text(const std::vector<LayerSpec>& layers) {
  std::string s;
  for (const LayerSpec& l : layers) s += (s.empty() ? "" : " ") + l.text();
  return s;
}

std::vector<LayerSpec> mlp_layer_list(const std::vector<int>& widths, Act act) {
  std::vector<LayerSpec> out;
  for (size_t i = 1; i < widths.size(); ++i) {
    LayerSpec l;
    l.kind = LayerKind::linear;
    l.out = widths[i];
    out.push_back(l);
    if (i + 1 < widths.size() && act != Act::none) {
      LayerSpec a;
      a.kind = LayerKind::act;
      a.act = act;
      out.push_back(a);
    }
  }
  return out;
}

ModelPlan plan_model(const std::vector<LayerSpec>& layers, const TensorShape& input, int num_classes) {
  ModelPlan m;
  m.input = input;
  TensorShape cur = input;
  int convs = 0, fcs = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    PlannedLayer p;
    p.spec = l;
    p.in = cur;
    TensorShape o = cur;
    switch (l.kind) {
      case LayerKind::conv:
      case LayerKind::maxpool:
      case LayerKind::avgpool: {
        const bool conv = l.kind == LayerKind::conv;
        if (cur.flat)
          bad_shape(i, l, cur, i == 0 ? "needs an image input (C x H x W): the data is flat; set "
                                        "model.input_shape = C,H,W"
                                      : "needs an image input, but its input is flat (a conv or "
                                        "pool cannot follow flatten or linear)");
        const int pad = conv ? l.pad : 0;
        if (cur.h + 2 * pad < l.k || cur.w + 2 * pad < l.k)
          bad_shape(i, l, cur, "kernel " + std::to_string(l.k) + "x" + std::to_string(l.k) +
                                   " is larger than its input " + std::to_string(cur.h) + "x" +
                                   std::to_string(cur.w) +
                                   (pad ? " padded by " + std::to_string(pad) : std::string()));
        o = TensorShape::image(conv ? l.out : cur.c, conv_out(cur.h, l.k, l.stride, pad),
                               conv_out(cur.w, l.k, l.stride, pad));
        if (conv) {
          p.weights = int64_t(l.out) * cur.c * l.k * l.k;
          p.biases = l.out;
          p.name = "conv" + std::to_string(convs++);
        }
        break;
      }
      case LayerKind::flatten:
        o = TensorShape::features(cur.size());
        break;
      case LayerKind::linear:
        if (!cur.flat && i > 0)
          bad_shape(i, l, cur, "needs a flat input: put flatten before it");
        p.weights = int64_t(l.out) * cur.size();
        p.biases = l.out;
        p.name = "fc" + std::to_string(fcs++);
        o = TensorShape::features(l.out);
        break;
      case LayerKind::act:
      case LayerKind::dropout:
        break;
    }
    if (o.size() > kMaxSampleElems)
      bad_shape(i, l, cur, "its output " + o.str() + " has more than 2^31 - 1 elements per sample");
    p.out = o;
    m.params += p.weights + p.biases;
    if (m.params > kMaxParams)
      bad_shape(i, l, cur, "the model has more than 2^34 parameters at this layer");
    m.layers.push_back(p);
    cur = o;
  }
  if (m.params == 0) throw InputError("the model has no parameters (no conv or linear layer)");
  if (!cur.flat)
    throw InputError("the model's output " + cur.str() + " (after layer " + std::to_string(layers.size()) +
                     " '" + layers.back().text() + "') is not flat: end the list with flatten or linear(N)");
  if (cur.c < num_classes)
    throw InputError("the model's output has " + std::to_string(cur.c) + " values (after layer " +
                     std::to_string(layers.size()) + " '" + layers.back().text() + "') but the data has " +
                     std::to_string(num_classes) + " classes: the last layer must be at least that wide");
  return m;
}

std::string ModelPlan::describe() const {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "  %-3s %-28s %-8s %-14s %12s\n", "#", "layer", "name", "output", "params");
  os << line;
  std::snprintf(line, sizeof line, "  %-3s %-28s %-8s %-14s %12s\n", "", "input", "", input.str().c_str(), "");
  os << line;
  for (size_t i = 0; i < layers.size(); ++i) {
    const PlannedLayer& p = layers[i];
    std::snprintf(line, sizeof line, "  %-3zu %-28s %-8s %-14s %12lld\n", i + 1, p.spec.text().c_str(),
                  p.name.c_str(), p.out.str().c_str(), static_cast<long long>(p.weights + p.biases));
    os << line;
  }
  std::snprintf(line, sizeof line, "  total parameters %lld\n", static_cast<long long>(params));
  os << line;
  return os.str();
}

std::vector<int> parse_input_shape(const std::string& text) {
  const std::string t = trim(text);
  if (t.empty()) return {};
  std::vector<int> v;
  std::stringstream in(t);
  std::string part;
  while (std::getline(in, part, ',')) {
    part = trim(part);
    int x = 0;
    const auto r = std::from_chars(part.data(), part.data() + part.size(), x);
    if (part.empty() || r.ec != std::errc() || r.ptr != part.data() + part.size() || x < 1 || x > (1 << 20))
      throw InputError("'" + part + "' is not an integer in [1, 1048576]; expected C,H,W");
    v.push_back(x);
  }
  if (v.size() != 3 || t.back() == ',') throw InputError("expected three sizes C,H,W");
  return v;
}

TensorShape model_input_shape(const std::vector<int64_t>& sample_shape,
                              const std::vector<int>& input_shape, const std::string& what) {
  int64_t d = 1;
  for (int64_t s : sample_shape) d *= s;
  const bool image = sample_shape.size() == 3;
  if (input_shape.empty())
    return image ? TensorShape::image(sample_shape[0], sample_shape[1], sample_shape[2])
                 : TensorShape::features(d);
  const TensorShape want = TensorShape::image(input_shape[0], input_shape[1], input_shape[2]);
  if (want.size() != d || (image && !(want == TensorShape::image(sample_shape[0], sample_shape[1], sample_shape[2]))))
    throw InputError("model.input_shape = " + want.str() + " (" + std::to_string(want.size()) +
                     " values) does not fit " + what + ", whose samples are " +
                     (image ? TensorShape::image(sample_shape[0], sample_shape[1], sample_shape[2]).str()
                            : std::to_string(d) + " values"));
  return want;
}

}  // namespace dpt
