// CUDA-graph capture of the training step (GraphRunner) and the backend's hooks around it:
// weight shadows refreshed outside the graph, activation copies dropped and scratch trimmed to
// the step's need when capture starts.
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>
#include <utility>

#include "backend_impl.hpp"
#include "dpt/cuda_check.hpp"
#include "dpt/log.hpp"
#include "kernels.cuh"

namespace dpt::cuda_impl {
namespace {

// Runs the step eagerly once (it sizes every scratch buffer and lets NCCL and cuBLAS do their
// lazy set-up), records the second call into a CUDA graph and launches it, then only launches.
// Work captured from other streams (the NCCL transport's comm stream) joins through the events
// the transport records, so the graph holds the overlap of backward and allreduce as well.
class GraphRunner final : public StepRunner {
 public:
  GraphRunner(std::function<void()> step, CudaBackendImpl& be, bool capture)
      : step_(std::move(step)), be_(be), stream_(be.compute_stream()), capture_(capture) {}
  ~GraphRunner() override {
    if (exec_) {
      cudaGraphExecDestroy(exec_);
      count_graphs(-1);
    }
  }

  void run() override {
    if (exec_) {
      be_.refresh_shadows();  // after writes between replays (upload, broadcast, average)
      DPT_CHECK_CUDA(cudaGraphLaunch(exec_, stream_));
      if (leaves_stale_) be_.mark_shadows_stale();
      return;
    }
    if (!capture_ || calls_++ == 0) {
      step_();
      return;
    }
    cudaGraph_t graph = nullptr;
    be_.capture_begin();
    DPT_CHECK_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      step_();
    } catch (...) {
      cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      throw;
    }
    DPT_CHECK_CUDA(cudaStreamEndCapture(stream_, &graph));
    leaves_stale_ = be_.capture_leaves_stale();
    const cudaError_t rc = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    DPT_CHECK_CUDA(rc);
    count_graphs(+1);
    DPT_CHECK_CUDA(cudaGraphLaunch(exec_, stream_));
  }

  bool captured() const override { return exec_ != nullptr; }

 private:
  std::function<void()> step_;
  CudaBackendImpl& be_;
  cudaStream_t stream_;
  bool capture_;
  bool leaves_stale_ = false;
  int calls_ = 0;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace

// ---- the step graph's hooks (GraphRunner) ----
// Before a replay or a capture: refresh stale weight shadows eagerly, outside the graph (the
// graph was captured with them fresh, and only the optimizer's fused write changes them).
void CudaBackendImpl::refresh_shadows() {
  for (Shadow& sh : shadows_)
    if (sh.dirty) {
      cuda::to_bf16(sh.p, sh.w16.get(), sh.n, stream_.get());
      sh.dirty = false;
    }
}

// Capture starts: every activation copy must be produced inside the step to be used there, so
// that each replay uses the copy its own producer wrote.
void CudaBackendImpl::capture_begin() {
  trim_scratch();  // the eager step's outgrown scratch, and start-up timing's excess (not while another graph lives)
  say_scratch();
  refresh_shadows();
  for (auto& t : twins_) {  // a bf16-only tensor too: its producer in the step makes it again
    t.second.valid = 0;
    t.second.only = false;
  }
}

std::vector<std::pair<const char*, const Scratch*>> CudaBackendImpl::named_scratch() const {
  return {{"bf16 operand a", &bf16_a_}, {"bf16 operand b", &bf16_b_}, {"bf16 operand c", &bf16_c_},
          {"bf16 dz", &bf16_dz_}, {"bias-gradient partials", &partial_}, {"batch norm partials", &bn_partial_},
          {"conv workspace", &conv_ws_}, {"conv bf16 output", &conv_y16_}, {"conv bf16 input gradient", &conv_dx16_},
          {"conv bf16 weight gradient", &conv_dw16_}, {"padded input", &pad_x_}, {"padded weight", &pad_w_},
          {"narrow columns", &narrow_cols_}, {"tf32 transposes", &tposed_x_},
          {"tf32 transposes", &tposed_dz_}};
}

// One line, when the first step graph is captured: the scratch buffers of 1 MiB or more that the
// eager step sized (each is held while the backend lives).
void CudaBackendImpl::say_scratch() {
  if (scratch_said_) return;
  scratch_said_ = true;
  std::string s;
  for (const auto& [name, sc] : named_scratch())
    if (sc->capacity() >= (size_t(1) << 20))
      s += std::string(s.empty() ? "" : ", ") + name + " " + std::to_string(sc->capacity() >> 20) + " MiB";
  if (!s.empty()) log::info("cuda: scratch held by the step: " + s);
}

// Capture ended: true when the captured step leaves a weight shadow stale (a write into the
// arena other than the optimizer's, after the step's last use); each replay must then mark it.
bool CudaBackendImpl::capture_leaves_stale() const {
  for (const Shadow& sh : shadows_)
    if (sh.dirty) return true;
  return false;
}

void CudaBackendImpl::mark_shadows_stale() {
  for (Shadow& sh : shadows_) sh.dirty = true;
}

bool CudaBackendImpl::capturing() const {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  DPT_CHECK_CUDA(cudaStreamIsCapturing(stream_.get(), &st));
  return st != cudaStreamCaptureStatusNone;
}

std::unique_ptr<StepRunner> CudaBackendImpl::make_runner(std::function<void()> step, bool capture) {
  return std::make_unique<GraphRunner>(std::move(step), *this, capture);
}

}  // namespace dpt::cuda_impl
