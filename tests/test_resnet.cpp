// Batch norm, residual blocks and the ResNet presets: the layer list's syntax and errors, shape
// planning and torchvision's names.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "dpt/check.hpp"
#include "dpt/layer_spec.hpp"

using namespace dpt;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

const PlannedLayer* find_named(const ModelPlan& m, const std::string& name) {
  for (const PlannedLayer& p : m.layers)
    if (p.name == name) return &p;
  return nullptr;
}

}  // namespace

// ---- syntax ---------------------------------------------------------------------------------

TEST(ResnetList, ParsesAndNormalises) {
  const std::string text =
      "conv(16,3,pad=1,bias=false) bn relu maxpool(3, stride=2, pad=1) "
      "res( conv(16,3,pad=1,bias=false) bn relu conv(16,3,pad=1,bias=false) bn ) relu "
      "res(conv(32,3,stride=2,pad=1,bias=false) bn relu conv(32,3,pad=1,bias=false) bn | conv(32,1,stride=2,bias=false) bn) relu "
      "avgpool(global) flatten linear(10) bn";
  const auto l = parse_layer_list(text);
  ASSERT_EQ(l.size(), 12u);
  EXPECT_FALSE(l[0].bias);
  EXPECT_EQ(l[1].kind, LayerKind::bn);
  EXPECT_EQ(l[3].pad, 1);
  EXPECT_EQ(l[4].kind, LayerKind::res);
  EXPECT_EQ(l[4].body.size(), 5u);
  EXPECT_TRUE(l[4].shortcut.empty());
  EXPECT_EQ(l[6].shortcut.size(), 2u);
  EXPECT_TRUE(l[8].global);
  const std::string norm = layer_list_text(l);
  EXPECT_EQ(norm,
            "conv(16,3,stride=1,pad=1,bias=false) bn relu maxpool(3,stride=2,pad=1) "
            "res(conv(16,3,stride=1,pad=1,bias=false) bn relu conv(16,3,stride=1,pad=1,bias=false) bn) relu "
            "res(conv(32,3,stride=2,pad=1,bias=false) bn relu conv(32,3,stride=1,pad=1,bias=false) bn | "
            "conv(32,1,stride=2,pad=0,bias=false) bn) relu avgpool(global) flatten linear(10) bn");
  EXPECT_EQ(parse_layer_list(norm), l);
  // Today's lists keep their normalised text (checkpoints record it).
  EXPECT_EQ(layer_list_text(parse_layer_list("conv(8,3,bias=true) maxpool(2) flatten linear(2)")),
            "conv(8,3,stride=1,pad=0) maxpool(2,stride=2) flatten linear(2)");
  // Nested blocks.
  const auto n = parse_layer_list("conv(4,3) res(res(conv(4,3,pad=1)) relu | conv(4,1)) flatten linear(2)");
  ASSERT_EQ(n[1].body.size(), 2u);
  EXPECT_EQ(n[1].body[0].kind, LayerKind::res);
  EXPECT_EQ(parse_layer_list(layer_list_text(n)), n);
  // Presets.
  const auto p = parse_layer_list("resnet18(stem=small)");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].kind, LayerKind::preset);
  EXPECT_TRUE(p[0].small_stem);
  EXPECT_EQ(layer_list_text(p), "resnet18(stem=small)");
  EXPECT_EQ(layer_list_text(parse_layer_list("resnet50(stem=default, classes=7)")), "resnet50(classes=7)");
}

TEST(ResnetList, ErrorsNameTheLayerAndWhatIsWrong) {
  struct Case { const char* list; const char* expect; };
  const Case cases[] = {
      {"conv(8,3,bias=no)", "bias 'no' is not true or false"},
      {"bn(4) linear(2)", "bn takes no arguments"},
      {"conv(8,3) res(conv(8,3) | conv(8,1) | conv(8,1))", "one '|' at most"},
      {"conv(8,3) res( | conv(8,1))", "the block's body is empty"},
      {"conv(8,3) res(conv(8,3) | )", "the shortcut after '|' is empty"},
      {"conv(8,3) res(conv(8,3) bogus)", "layer 2 'res(conv(8,3) bogus)': in its body: layer 2 'bogus': unknown layer"},
      {"conv(8,3) res", "expected res(<body>[ | <shortcut>])"},
      {"resnet19", "unknown layer 'resnet19'"},
      {"resnet18(stem=tiny)", "stem 'tiny' is not small or default"},
      {"resnet18(depth=3)", "unknown argument 'depth'"},
      {"conv(8,3) res(resnet18)", "a preset is a whole model"},
      {"maxpool(2,pad=2) linear(2)", "more than half the kernel"},
      {"avgpool(global,stride=2) linear(2)", "avgpool(global) takes no other argument"},
      {"conv(8,3) res(conv(8,3) res(conv(8,3) res(conv(8,3) res(conv(8,3) res(conv(8,3) res(conv(8,3) "
       "res(conv(8,3) res(conv(8,3) res(conv(8,3))))))))))",
       "nested more than 8 deep"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of([&] { parse_layer_list(c.list); });
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.list << " -> " << e;
  }
}

// ---- shapes ---------------------------------------------------------------------------------

TEST(ResnetPlan, ShapesCountsAndNames) {
  const ModelPlan m = plan_model(
      parse_layer_list("conv(8,3,pad=1,bias=false) bn relu maxpool(3,stride=2,pad=1) "
                       "res(conv(8,3,pad=1,bias=false) bn relu conv(8,3,pad=1,bias=false) bn) relu "
                       "res(conv(16,3,stride=2,pad=1) bn | conv(16,1,stride=2,bias=false) bn) relu "
                       "avgpool(global) flatten linear(10) bn"),
      TensorShape::image(3, 9, 9), 10);
  EXPECT_EQ(m.layers[0].weights, 8 * 3 * 9);
  EXPECT_EQ(m.layers[0].biases, 0);
  EXPECT_EQ(m.layers[1].name, "bn0");
  EXPECT_EQ(m.layers[1].weights, 8);
  EXPECT_EQ(m.layers[3].out, TensorShape::image(8, 5, 5));  // (9 + 2 - 3) / 2 + 1
  EXPECT_EQ(m.layers[4].spec.kind, LayerKind::res_begin);
  EXPECT_EQ(m.layers[5].depth, 1);
  const PlannedLayer* sc = find_named(m, "conv4");
  ASSERT_NE(sc, nullptr);
  EXPECT_EQ(sc->out, TensorShape::image(16, 3, 3));
  EXPECT_EQ(find_named(m, "conv3")->biases, 16);
  EXPECT_EQ(find_named(m, "bn5")->out, TensorShape::features(10));  // BatchNorm1d over features
  EXPECT_TRUE(m.has_bn());
  EXPECT_FALSE(m.preset);
  const std::string d = m.describe();
  EXPECT_NE(d.find("  res("), std::string::npos) << d;
  EXPECT_NE(d.find("avgpool(global)"), std::string::npos) << d;
  EXPECT_NE(d.find("16x1x1"), std::string::npos) << d;
}

TEST(ResnetPlan, Errors) {
  struct Case { const char* list; TensorShape in; const char* expect; };
  const auto img = TensorShape::image(3, 8, 8);
  const Case cases[] = {
      {"bn conv(8,3) flatten linear(2)", img, "layer 1 'bn' (input 3x8x8): bn before any layer"},
      {"res(bn conv(3,3,pad=1)) flatten linear(2)", img, "bn before any layer"},
      {"conv(8,3,pad=1) res(conv(16,3,pad=1) bn) flatten linear(2)", img,
       "layer 2 'res(conv(16,3,stride=1,pad=1) bn)' (input 8x8x8): its body gives 16x8x8 but its shortcut "
       "(the identity) gives 8x8x8: a block that changes shape needs a projection shortcut"},
      {"conv(8,3,pad=1) res(conv(8,3,stride=2,pad=1) | conv(8,1)) flatten linear(2)", img,
       "its body gives 8x4x4 but its shortcut gives 8x8x8"},
      {"conv(8,3,pad=1) res(conv(8,3,pad=1) | flatten linear(2)) flatten linear(2)", img,
       "its body gives 8x8x8 but its shortcut gives 2"},
      {"conv(8,3,pad=1) res(conv(8,3,pad=1) | conv(8,9)) flatten linear(2)", img,
       "layer 2 'res(conv(8,3,stride=1,pad=1) | conv(8,9,stride=1,pad=0))', its shortcut: layer 1 "
       "'conv(8,9,stride=1,pad=0)' (input 8x8x8): kernel 9x9 is larger"},
      {"flatten avgpool(global) linear(2)", img, "needs an image input"},
      {"conv(8,3) avgpool(global) linear(2)", img, "needs a flat input"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of([&] { plan_model(parse_layer_list(c.list), c.in, 2); });
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.list << " -> " << e;
  }
  EXPECT_NE(error_of([] { plan_model(parse_layer_list("resnet18 linear(2)"), TensorShape::image(3, 32, 32), 2); })
                .find("a preset is the whole model"),
            std::string::npos);
  EXPECT_NE(error_of([] { plan_model(parse_layer_list("resnet18"), TensorShape::image(3, 32, 32), 0); })
                .find("the number of classes is not known"),
            std::string::npos);
}

// Parameter counts of torchvision's resnet18/34/50 (3 input channels, 1000 classes), and the
// state_dict names of the expanded presets.
TEST(ResnetPlan, PresetsAreTorchvisionsArchitectures) {
  const auto in = TensorShape::image(3, 224, 224);
  EXPECT_EQ(plan_model(parse_layer_list("resnet18"), in, 1000).params, 11689512);
  EXPECT_EQ(plan_model(parse_layer_list("resnet34"), in, 1000).params, 21797672);
  const ModelPlan r50 = plan_model(parse_layer_list("resnet50"), in, 1000);
  EXPECT_EQ(r50.params, 25557032);
  EXPECT_TRUE(r50.preset);
  EXPECT_EQ(r50.text, "resnet50(classes=1000)");
  EXPECT_EQ(r50.output(), TensorShape::features(1000));
  ASSERT_NE(find_named(r50, "layer4.2.bn3"), nullptr);
  EXPECT_EQ(find_named(r50, "layer4.2.bn3")->out, TensorShape::image(2048, 7, 7));
  // Bottlenecks stride on their 3x3 conv.
  EXPECT_EQ(find_named(r50, "layer2.0.conv1")->spec.stride, 1);
  EXPECT_EQ(find_named(r50, "layer2.0.conv2")->spec.stride, 2);
  EXPECT_NE(find_named(r50, "layer1.0.downsample.0"), nullptr);  // 64 -> 256 channels
  EXPECT_EQ(find_named(r50, "layer1.1.downsample.0"), nullptr);

  const ModelPlan s = plan_model(parse_layer_list("resnet18(stem=small)"), TensorShape::image(1, 28, 28), 10);
  EXPECT_EQ(s.text, "resnet18(stem=small,classes=10)");
  EXPECT_EQ(s.layers[0].spec.k, 3);
  EXPECT_EQ(s.layers[0].out, TensorShape::image(64, 28, 28));
  EXPECT_EQ(find_named(s, "layer4.1.bn2")->out, TensorShape::image(512, 4, 4));
  EXPECT_EQ(find_named(s, "fc")->weights, 5120);
  EXPECT_EQ(s.params, 11689512 - 3 * 64 * 49 + 64 * 9 - 513 * 1000 + 513 * 10);
  // The normalised text plans again to the same model (a checkpoint's `model`).
  EXPECT_EQ(plan_model(parse_layer_list(s.text), TensorShape::image(1, 28, 28), 0).params, s.params);
  const std::string d = s.describe();
  EXPECT_NE(d.find("layer3.0.downsample.1"), std::string::npos) << d;
}
