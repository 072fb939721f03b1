// CUDA-graph capture of the training step (GraphRunner) and the backend's hooks around it:
// weight shadows refreshed outside the graph, activation copies dropped and outgrown scratch
// freed when capture starts.
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <utility>

#include "backend_impl.hpp"
#include "dpt/cuda_check.hpp"
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
  free_retired_scratch();  // the eager step's outgrown scratch (none while another graph lives)
  refresh_shadows();
  for (auto& t : twins_) {  // a bf16-only tensor too: its producer in the step makes it again
    t.second.valid = 0;
    t.second.only = false;
  }
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
