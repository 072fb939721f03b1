#include "dpt/layer_spec.hpp"

#include <algorithm>
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
// A max pooling keeps each output's window index kh·k + kw in a byte (Backend::pool_forward).
constexpr int kMaxPoolKernel = 15;

const char* kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::conv: return "conv";
    case LayerKind::maxpool: return "maxpool";
    case LayerKind::avgpool: return "avgpool";
    case LayerKind::flatten: return "flatten";
    case LayerKind::linear: return "linear";
    case LayerKind::dropout: return "dropout";
    case LayerKind::bn: return "bn";
    case LayerKind::res: return "res";
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
      size_t close = j;  // the matching ')': residual blocks hold layer lists with parentheses
      for (int depth = 0; close < s.size(); ++close) {
        depth += s[close] == '(' ? 1 : s[close] == ')' ? -1 : 0;
        if (depth == 0) break;
      }
      if (close == s.size()) {
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
                   "flatten, linear, dropout, bn, res, resnet18, resnet34, resnet50)");
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

bool bool_arg(const Token& t, const std::string& what, const std::string& v) {
  if (v == "true") return true;
  if (v == "false") return false;
  bad_layer(t, what + " '" + v + "' is not true or false");
}

constexpr int kMaxResDepth = 8;  // residual blocks inside residual blocks

std::vector<LayerSpec> parse_list(const std::string& text, int depth);

// res(<body>[ | <shortcut>]): two layer lists split at the '|' outside any parentheses.
void parse_res(const Token& t, LayerSpec& l, int depth) {
  if (depth >= kMaxResDepth) bad_layer(t, "residual blocks nested more than " + std::to_string(kMaxResDepth) + " deep");
  std::vector<size_t> bars;
  int d = 0;
  for (size_t i = 0; i < t.args.size(); ++i) {
    d += t.args[i] == '(' ? 1 : t.args[i] == ')' ? -1 : 0;
    if (d == 0 && t.args[i] == '|') bars.push_back(i);
  }
  if (bars.size() > 1) bad_layer(t, "a residual block has one '|' at most: res(<body> | <shortcut>)");
  const std::string body = bars.empty() ? t.args : t.args.substr(0, bars[0]);
  const std::string sc = bars.empty() ? std::string() : t.args.substr(bars[0] + 1);
  auto branch = [&](const std::string& text, const char* which) {
    try {
      return parse_list(text, depth + 1);
    } catch (const InputError& e) {
      bad_layer(t, std::string("in its ") + which + ": " + e.what());
    }
  };
  if (trim(body).empty()) bad_layer(t, "the block's body is empty: res(<body>[ | <shortcut>])");
  l.body = branch(body, "body");
  if (!bars.empty()) {
    if (trim(sc).empty()) bad_layer(t, "the shortcut after '|' is empty (leave out '|' for the identity)");
    l.shortcut = branch(sc, "shortcut");
  }
}

LayerSpec parse_token(const Token& t, int depth) {
  const std::string& n = t.name;
  LayerSpec l;
  if (n == "res") {
    if (!t.parens) bad_layer(t, "expected res(<body>[ | <shortcut>])");
    l.kind = LayerKind::res;
    parse_res(t, l, depth);
    return l;
  }
  const Args a = split_args(t);
  if (n == "conv") {
    expect_args(t, a, 2, 2, {"stride", "pad", "bias"}, "conv(C_out, K[, stride=S][, pad=P][, bias=false])");
    l.kind = LayerKind::conv;
    l.out = int_arg(t, "C_out", a.pos[0], 1, kMaxWidth);
    l.k = int_arg(t, "kernel size", a.pos[1], 1, kMaxKernel);
    if (auto* s = named(a, "stride")) l.stride = int_arg(t, "stride", *s, 1, kMaxStride);
    if (auto* p = named(a, "pad")) l.pad = int_arg(t, "pad", *p, 0, kMaxPad);
    if (auto* b = named(a, "bias")) l.bias = bool_arg(t, "bias", *b);
  } else if (n == "maxpool" || n == "avgpool") {
    l.kind = n == "maxpool" ? LayerKind::maxpool : LayerKind::avgpool;
    if (n == "avgpool" && a.pos.size() == 1 && a.pos[0] == "global") {
      if (!a.kw.empty()) bad_layer(t, "avgpool(global) takes no other argument");
      l.global = true;
      return l;
    }
    expect_args(t, a, 1, 1, {"stride", "pad"}, (n + "(K[, stride=S][, pad=P])" + (n == "avgpool" ? " or avgpool(global)" : "")).c_str());
    l.k = int_arg(t, "kernel size", a.pos[0], 1, n == "maxpool" ? kMaxPoolKernel : kMaxKernel);
    l.stride = l.k;
    if (auto* s = named(a, "stride")) l.stride = int_arg(t, "stride", *s, 1, kMaxStride);
    if (auto* p = named(a, "pad")) l.pad = int_arg(t, "pad", *p, 0, kMaxPad);
    if (2 * l.pad > l.k) bad_layer(t, "pad " + std::to_string(l.pad) + " is more than half the kernel " + std::to_string(l.k) + " (PyTorch's limit)");
  } else if (n == "relu" || n == "tanh" || n == "sigmoid" || n == "gelu" || n == "flatten" || n == "bn") {
    if (!a.pos.empty() || !a.kw.empty()) bad_layer(t, n + " takes no arguments");
    l.kind = n == "flatten" ? LayerKind::flatten : n == "bn" ? LayerKind::bn : LayerKind::act;
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
  } else if (n == "resnet18" || n == "resnet34" || n == "resnet50") {
    expect_args(t, a, 0, 0, {"stem", "classes"}, (n + "[(stem=small|default][, classes=N])").c_str());
    if (depth > 0) bad_layer(t, "a preset is a whole model: it cannot be inside a residual block");
    l.kind = LayerKind::preset;
    l.preset = n;
    if (auto* st = named(a, "stem")) {
      if (*st != "small" && *st != "default") bad_layer(t, "stem '" + *st + "' is not small or default");
      l.small_stem = *st == "small";
    }
    if (auto* c = named(a, "classes")) l.classes = int_arg(t, "classes", *c, 1, kMaxWidth);
  } else {
    bad_layer(t, "unknown layer '" + n + "' (conv, maxpool, avgpool, relu, tanh, sigmoid, gelu, "
                 "flatten, linear, dropout, bn, res, or a preset: resnet18, resnet34, resnet50)");
  }
  return l;
}

std::vector<LayerSpec> parse_list(const std::string& text, int depth) {
  std::vector<LayerSpec> out;
  for (const Token& t : tokenize(text)) out.push_back(parse_token(t, depth));
  if (out.empty()) throw InputError("the layer list is empty");
  return out;
}

int64_t conv_out(int64_t in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }

}  // namespace

std::string LayerSpec::text() const {
  switch (kind) {
    case LayerKind::conv:
      return "conv(" + std::to_string(out) + "," + std::to_string(k) + ",stride=" +
             std::to_string(stride) + ",pad=" + std::to_string(pad) + (bias ? "" : ",bias=false") + ")";
    case LayerKind::maxpool:
    case LayerKind::avgpool:
      if (global) return "avgpool(global)";
      return std::string(kind_name(kind)) + "(" + std::to_string(k) + ",stride=" + std::to_string(stride) +
             (pad ? ",pad=" + std::to_string(pad) : std::string()) + ")";
    case LayerKind::act: return act_text(act);
    case LayerKind::flatten: return "flatten";
    case LayerKind::linear: return "linear(" + std::to_string(out) + ")";
    case LayerKind::dropout: return "dropout(" + shortest(p) + ")";
    case LayerKind::bn: return "bn";
    case LayerKind::res:
      return "res(" + layer_list_text(body) + (shortcut.empty() ? "" : " | " + layer_list_text(shortcut)) + ")";
    case LayerKind::preset: {
      std::string a = small_stem ? "stem=small" : "";
      if (classes) a += (a.empty() ? "" : ",") + std::string("classes=") + std::to_string(classes);
      return preset + (a.empty() ? "" : "(" + a + ")");
    }
    case LayerKind::res_begin: return "res(";
    case LayerKind::res_shortcut: return "|";
    case LayerKind::res_end: return ")";
  }
  return "?";
}

bool LayerSpec::operator==(const LayerSpec& o) const {
  return kind == o.kind && out == o.out && k == o.k && stride == o.stride && pad == o.pad &&
         bias == o.bias && global == o.global && act == o.act && p == o.p && body == o.body &&
         shortcut == o.shortcut && preset == o.preset && small_stem == o.small_stem && classes == o.classes;
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
  return parse_list(text, 0);
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

namespace {

LayerSpec conv_spec(int out, int k, int stride, int pad, const std::string& name) {
  LayerSpec l;
  l.kind = LayerKind::conv;
  l.out = out, l.k = k, l.stride = stride, l.pad = pad, l.bias = false, l.name = name;
  return l;
}
LayerSpec simple_spec(LayerKind kind, const std::string& name = "") {
  LayerSpec l;
  l.kind = kind;
  l.name = name;
  if (kind == LayerKind::act) l.act = Act::relu;
  return l;
}

// Shape inference over a list that may hold residual blocks, which it lists flat (LayerKind).
struct Planner {
  ModelPlan& m;
  int convs = 0, fcs = 0, bns = 0;
  bool seen = false;  // a layer that computes something came before

  [[noreturn]] static void bad(const std::string& where, size_t i, const LayerSpec& l, const TensorShape& in,
                               const std::string& why) {
    throw InputError(where + "layer " + std::to_string(i + 1) + " '" + l.text() + "' (input " + in.str() + "): " + why);
  }

  void list(const std::vector<LayerSpec>& layers, TensorShape& cur, int depth, const std::string& where) {
    for (size_t i = 0; i < layers.size(); ++i) {
      const LayerSpec& l = layers[i];
      if (l.kind == LayerKind::preset) {
        if (depth > 0 || layers.size() != 1)
          bad(where, i, l, cur, "a preset is the whole model: model.layers = " + l.preset + "[(stem=small)] alone");
        list(expand_preset(l), cur, depth, where + "layer 1 '" + l.text() + "', ");
        continue;
      }
      if (l.kind == LayerKind::res) {
        block(l, cur, depth, where + "layer " + std::to_string(i + 1) + " '" + l.text() + "', ");
        continue;
      }
      layer(l, cur, depth, i, where);
    }
  }

  void push(const PlannedLayer& p, size_t i, const std::string& where) {
    if (p.out.size() > kMaxSampleElems)
      bad(where, i, p.spec, p.in, "its output " + p.out.str() + " has more than 2^31 - 1 elements per sample");
    m.params += p.weights + p.biases;
    if (m.params > kMaxParams) bad(where, i, p.spec, p.in, "the model has more than 2^34 parameters at this layer");
    m.layers.push_back(p);
  }

  void block(const LayerSpec& l, TensorShape& cur, int depth, const std::string& where) {
    PlannedLayer p;
    p.spec = l;
    p.spec.kind = LayerKind::res_begin;
    p.in = p.out = cur;
    p.depth = depth;
    const TensorShape in = cur;
    push(p, 0, where);
    TensorShape body = in, sc = in;
    list(l.body, body, depth + 1, where + "its body: ");
    p.spec.kind = LayerKind::res_shortcut;
    p.in = body;
    p.out = in;
    push(p, 0, where);
    list(l.shortcut, sc, depth + 1, where + "its shortcut: ");
    if (!(body == sc))
      throw InputError(where.substr(0, where.size() - 2) + " (input " + in.str() + "): its body gives " + body.str() +
                       " but its shortcut " + (l.shortcut.empty() ? "(the identity) " : "") + "gives " + sc.str() +
                       (l.shortcut.empty() ? ": a block that changes shape needs a projection shortcut, e.g. "
                                             "res(... | conv(C,1,stride=S,bias=false) bn)"
                                           : ""));
    p.spec.kind = LayerKind::res_end;
    p.in = p.out = body;
    push(p, 0, where);
    cur = body;
  }

  void layer(const LayerSpec& l, TensorShape& cur, int depth, size_t i, const std::string& where) {
    PlannedLayer p;
    p.spec = l;
    p.in = cur;
    p.depth = depth;
    TensorShape o = cur;
    switch (l.kind) {
      case LayerKind::conv:
      case LayerKind::maxpool:
      case LayerKind::avgpool: {
        const bool conv = l.kind == LayerKind::conv;
        if (cur.flat)
          bad(where, i, l, cur, !seen ? "needs an image input (C x H x W): the data is flat; set "
                                        "model.input_shape = C,H,W"
                                      : "needs an image input, but its input is flat (a conv or "
                                        "pool cannot follow flatten or linear)");
        if (l.global) {
          o = TensorShape::image(cur.c, 1, 1);
          break;
        }
        if (cur.h + 2 * l.pad < l.k || cur.w + 2 * l.pad < l.k)
          bad(where, i, l, cur, "kernel " + std::to_string(l.k) + "x" + std::to_string(l.k) +
                                   " is larger than its input " + std::to_string(cur.h) + "x" +
                                   std::to_string(cur.w) +
                                   (l.pad ? " padded by " + std::to_string(l.pad) : std::string()));
        o = TensorShape::image(conv ? l.out : cur.c, conv_out(cur.h, l.k, l.stride, l.pad),
                               conv_out(cur.w, l.k, l.stride, l.pad));
        if (conv) {
          p.weights = int64_t(l.out) * cur.c * l.k * l.k;
          p.biases = l.bias ? l.out : 0;
          p.name = !l.name.empty() ? l.name : "conv" + std::to_string(convs++);
        }
        break;
      }
      case LayerKind::flatten:
        o = TensorShape::features(cur.size());
        break;
      case LayerKind::linear:
        if (!cur.flat && seen)
          bad(where, i, l, cur, "needs a flat input: put flatten before it");
        p.weights = int64_t(l.out) * cur.size();
        p.biases = l.out;
        p.name = !l.name.empty() ? l.name : "fc" + std::to_string(fcs++);
        o = TensorShape::features(l.out);
        break;
      case LayerKind::bn:
        if (!seen)
          bad(where, i, l, cur, "bn before any layer: batch norm normalises a layer's output; put it "
                                "after a conv, linear or flatten");
        p.weights = p.biases = cur.c;
        p.name = !l.name.empty() ? l.name : "bn" + std::to_string(bns++);
        break;
      default:
        break;
    }
    p.out = o;
    push(p, i, where);
    seen = true;
    cur = o;
  }
};

}  // namespace

std::vector<LayerSpec> expand_preset(const LayerSpec& preset) {
  int blocks[4] = {2, 2, 2, 2};
  bool bottleneck = false;
  if (preset.preset == "resnet34" || preset.preset == "resnet50") {
    blocks[1] = 4, blocks[2] = 6, blocks[0] = blocks[3] = 3;
    bottleneck = preset.preset == "resnet50";
  } else if (preset.preset != "resnet18") {
    throw InputError("unknown preset '" + preset.preset + "' (resnet18, resnet34, resnet50)");
  }
  if (preset.classes < 1) throw InputError(preset.preset + ": the number of classes is not known");
  std::vector<LayerSpec> out;
  if (preset.small_stem) {
    out.push_back(conv_spec(64, 3, 1, 1, "conv1"));
  } else {
    out.push_back(conv_spec(64, 7, 2, 3, "conv1"));
  }
  out.push_back(simple_spec(LayerKind::bn, "bn1"));
  out.push_back(simple_spec(LayerKind::act));
  if (!preset.small_stem) {
    LayerSpec mp = simple_spec(LayerKind::maxpool);
    mp.k = 3, mp.stride = 2, mp.pad = 1;
    out.push_back(mp);
  }
  // torchvision's _make_layer: the first block of a stage strides (on its 3x3 conv) and, where
  // the shape changes, projects its shortcut with a strided 1x1 conv and bn (downsample.0, .1).
  const int exp = bottleneck ? 4 : 1;
  int inplanes = 64;
  for (int s = 0; s < 4; ++s) {
    const int planes = 64 << s;
    for (int b = 0; b < blocks[s]; ++b) {
      const int stride = s > 0 && b == 0 ? 2 : 1;
      const std::string n = "layer" + std::to_string(s + 1) + "." + std::to_string(b) + ".";
      LayerSpec r = simple_spec(LayerKind::res);
      auto& body = r.body;
      if (bottleneck) {
        body = {conv_spec(planes, 1, 1, 0, n + "conv1"), simple_spec(LayerKind::bn, n + "bn1"), simple_spec(LayerKind::act),
                conv_spec(planes, 3, stride, 1, n + "conv2"), simple_spec(LayerKind::bn, n + "bn2"), simple_spec(LayerKind::act),
                conv_spec(planes * exp, 1, 1, 0, n + "conv3"), simple_spec(LayerKind::bn, n + "bn3")};
      } else {
        body = {conv_spec(planes, 3, stride, 1, n + "conv1"), simple_spec(LayerKind::bn, n + "bn1"), simple_spec(LayerKind::act),
                conv_spec(planes, 3, 1, 1, n + "conv2"), simple_spec(LayerKind::bn, n + "bn2")};
      }
      if (stride != 1 || inplanes != planes * exp)
        r.shortcut = {conv_spec(planes * exp, 1, stride, 0, n + "downsample.0"),
                      simple_spec(LayerKind::bn, n + "downsample.1")};
      out.push_back(r);
      out.push_back(simple_spec(LayerKind::act));
      inplanes = planes * exp;
    }
  }
  LayerSpec gap = simple_spec(LayerKind::avgpool);
  gap.global = true;
  out.push_back(gap);
  out.push_back(simple_spec(LayerKind::flatten));
  LayerSpec fc = simple_spec(LayerKind::linear, "fc");
  fc.out = preset.classes;
  out.push_back(fc);
  return out;
}

bool ModelPlan::has_bn() const {
  for (const PlannedLayer& p : layers)
    if (p.spec.kind == LayerKind::bn) return true;
  return false;
}

ModelPlan plan_model(const std::vector<LayerSpec>& layers_in, const TensorShape& input, int num_classes) {
  std::vector<LayerSpec> layers = layers_in;
  ModelPlan m;
  m.input = input;
  for (LayerSpec& l : layers)
    if (l.kind == LayerKind::preset) {
      m.preset = true;
      if (l.classes == 0) l.classes = num_classes;
      if (l.classes < 1)
        throw InputError("layer 1 '" + l.text() + "': the number of classes is not known (set classes=N)");
      expand_preset(l);  // an unknown preset fails here
    }
  m.text = layer_list_text(layers);
  TensorShape cur = input;
  Planner pl{m};
  pl.list(layers, cur, 0, "");
  const std::string last = "(after layer " + std::to_string(layers.size()) + " '" + layers.back().text() + "')";
  if (m.params == 0) throw InputError("the model has no parameters (no conv or linear layer)");
  if (!cur.flat)
    throw InputError("the model's output " + cur.str() + " " + last + " is not flat: end the list with flatten or linear(N)");
  if (cur.c < num_classes)
    throw InputError("the model's output has " + std::to_string(cur.c) + " values " + last + " but the data has " +
                     std::to_string(num_classes) + " classes: the last layer must be at least that wide");
  return m;
}

std::string ModelPlan::describe() const {
  std::ostringstream os;
  size_t wl = 28, wn = 8;  // column widths: the widest layer text (indented) and name
  for (const PlannedLayer& p : layers) {
    wl = std::max(wl, 2 * size_t(p.depth) + p.spec.text().size());
    wn = std::max(wn, p.name.size());
  }
  auto line = [&](const std::string& n, const std::string& l, const std::string& name, const std::string& out,
                  const std::string& params) {
    os << "  " << n << std::string(n.size() < 4 ? 4 - n.size() : 1, ' ') << l << std::string(wl + 1 - l.size(), ' ')
       << name << std::string(wn + 1 - name.size(), ' ') << out << std::string(out.size() < 15 ? 15 - out.size() : 1, ' ')
       << std::string(params.size() < 12 ? 12 - params.size() : 0, ' ') << params << "\n";
  };
  line("#", "layer", "name", "output", "params");
  line("", "input", "", input.str(), "");
  for (size_t i = 0; i < layers.size(); ++i) {
    const PlannedLayer& p = layers[i];
    const bool marker = p.spec.kind == LayerKind::res_shortcut || p.spec.kind == LayerKind::res_begin;
    line(std::to_string(i + 1), std::string(2 * size_t(p.depth), ' ') + p.spec.text(), p.name,
         marker ? "" : p.out.str(), marker ? "" : std::to_string(p.weights + p.biases));
  }
  os << "  total parameters " << params << "\n";
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
