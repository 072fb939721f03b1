// cuDNN 9's graph (backend) API: owned descriptors, the engine configurations the heuristics
// offer, a convolution's descriptor and the attributes of the three operations that take it.
// Shared by the product's convolution plans (cudnn_engines.cpp) and
// bench-cudnn-fusion, which times the same operations with batch norm fused around them.
#pragma once

#include <cudnn.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace dpt::cudnn_graph {

// The graph's and the plan's handle attributes, deprecated in cuDNN 9.x but still read
// (cudnn-frontend sets them); named by value so that the deprecation does not warn.
constexpr auto kGraphHandle = static_cast<cudnnBackendAttributeName_t>(800);  // OPERATIONGRAPH_HANDLE
constexpr auto kPlanHandle = static_cast<cudnnBackendAttributeName_t>(400);   // EXECUTION_PLAN_HANDLE
// The tensors' declared byte alignment: their operands' addresses must be multiples of it.
constexpr int64_t kAlignment = 16;

// A descriptor owned by a list (destroyed with it), or nullptr when cuDNN refuses to make it.
inline cudnnBackendDescriptor_t make(std::vector<cudnnBackendDescriptor_t>& owned, cudnnBackendDescriptorType_t t) {
  cudnnBackendDescriptor_t d = nullptr;
  if (cudnnBackendCreateDescriptor(t, &d) != CUDNN_STATUS_SUCCESS) return nullptr;
  owned.push_back(d);
  return d;
}

// An NHWC tensor: dims (n, c, h, w), strides (h·w·c, 1, w·c, c), 16-byte aligned; virtual ones
// live only inside a fused graph. nullptr where cuDNN refuses it.
inline cudnnBackendDescriptor_t nhwc_tensor(std::vector<cudnnBackendDescriptor_t>& owned, int64_t uid, int64_t n,
                                            int64_t c, int64_t h, int64_t w, cudnnDataType_t dt = CUDNN_DATA_BFLOAT16,
                                            bool virt = false) {
  cudnnBackendDescriptor_t d = make(owned, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t dims[4] = {n, c, h, w}, strides[4] = {h * w * c, 1, w * c, c};
  auto set = [&](cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t k, const void* v) {
    return cudnnBackendSetAttribute(d, a, t, k, v) == CUDNN_STATUS_SUCCESS;
  };
  if (!d || !set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt) ||
      !set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims) ||
      !set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides) ||
      !set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid) ||
      !set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kAlignment) ||
      !set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt) ||
      cudnnBackendFinalize(d) != CUDNN_STATUS_SUCCESS)
    return nullptr;
  return d;
}

// The engine configurations cuDNN's heuristics offer for an operation graph in one mode, best
// first (owned by the list); empty where it offers none.
inline std::vector<cudnnBackendDescriptor_t> offered(std::vector<cudnnBackendDescriptor_t>& owned,
                                                     cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode) {
  cudnnBackendDescriptor_t heur = make(owned, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  if (!heur ||
      cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph) !=
          CUDNN_STATUS_SUCCESS ||
      cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode) !=
          CUDNN_STATUS_SUCCESS ||
      cudnnBackendFinalize(heur) != CUDNN_STATUS_SUCCESS)
    return {};
  int64_t n = 0;
  if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr) !=
          CUDNN_STATUS_SUCCESS ||
      n <= 0)
    return {};
  std::vector<cudnnBackendDescriptor_t> cfgs;
  for (int64_t i = 0; i < n; ++i)
    if (cudnnBackendDescriptor_t c = make(owned, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)) cfgs.push_back(c);
  int64_t got = 0;
  if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               int64_t(cfgs.size()), &got, cfgs.data()) != CUDNN_STATUS_SUCCESS)
    return {};
  cfgs.resize(size_t(std::max<int64_t>(0, std::min<int64_t>(got, int64_t(cfgs.size())))));
  return cfgs;
}

// Sets and finalizes a CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: 2-d cross-correlation, fp32
// accumulation, square stride and symmetric zero padding. false where cuDNN refuses it.
inline bool set_conv_desc(cudnnBackendDescriptor_t conv, int64_t stride, int64_t padding) {
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t dims = 2, dil[2] = {1, 1}, str[2] = {stride, stride}, pad[2] = {padding, padding};
  auto set = [&](cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n, const void* v) {
    return cudnnBackendSetAttribute(conv, a, t, n, v) == CUDNN_STATUS_SUCCESS;
  };
  return conv && set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp) &&
         set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode) &&
         set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims) &&
         set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil) &&
         set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, str) &&
         set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad) &&
         set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad) &&
         cudnnBackendFinalize(conv) == CUDNN_STATUS_SUCCESS;
}

// A convolution operation's descriptor type and its x (dx), w (dw), y (dy), convolution, alpha
// and beta attributes.
struct ConvOpAttrs {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};

// dir: 0 forward, 1 input gradient (backward data), 2 weight gradient (backward filter).
inline const ConvOpAttrs& conv_op_attrs(int dir) {
  static const ConvOpAttrs kOps[3] = {
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA},
  };
  return kOps[dir];
}

// Sets and finalizes a convolution operation made as conv_op_attrs(dir).type: y = conv(x, w)
// forward, dx from dy and w (input gradient), dw from x and dy (weight gradient); alpha 1, beta 0.
inline bool set_conv_op(cudnnBackendDescriptor_t op, int dir, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t w,
                        cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t conv) {
  const ConvOpAttrs& at = conv_op_attrs(dir);
  const float alpha = 1.f, beta = 0.f;
  auto set = [&](cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, const void* v) {
    return cudnnBackendSetAttribute(op, a, t, 1, v) == CUDNN_STATUS_SUCCESS;
  };
  return op && set(at.x, CUDNN_TYPE_BACKEND_DESCRIPTOR, &x) && set(at.w, CUDNN_TYPE_BACKEND_DESCRIPTOR, &w) &&
         set(at.y, CUDNN_TYPE_BACKEND_DESCRIPTOR, &y) && set(at.conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, &conv) &&
         set(at.alpha, CUDNN_TYPE_FLOAT, &alpha) && set(at.beta, CUDNN_TYPE_FLOAT, &beta) &&
         cudnnBackendFinalize(op) == CUDNN_STATUS_SUCCESS;
}

}  // namespace dpt::cudnn_graph
