// bench-scaling: one launch measures every power-of-two subset of the ranks (weak and strong
// scaling with where the time goes, allreduce alone, bucket sizes), a batch-size / learning-rate
// grid on Fashion-MNIST with the time to a target accuracy on N ranks it predicts and measures,
// and an alpha-beta model; writes a table to stdout and a report folder.
//   mpirun -np 8 ./bench-scaling --config bench/scaling.ini [--out DIR] [--section.key value ...]
//   ./bench-scaling                       (one rank: n = 1 and the grid)
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "dpt/app.hpp"
#include "dpt/bench.hpp"
#include "dpt/check.hpp"
#include "dpt/log.hpp"

using namespace dpt;
using namespace dpt::bench;

int main(int argc, char** argv) {
  MpiSession mpi(argc, argv);
  const MPI_Comm world = MPI_COMM_WORLD;
  const auto t0 = std::chrono::steady_clock::now();
  Settings s;
  if (int rc = stage(world, [&] { s = read_settings(world, argc, argv); })) return rc;
  if (!s.help.empty()) {
    log::info(s.help);
    return 0;
  }
  Runtime rt;
  if (int rc = stage(world, [&] { make_backend_for(s.base, world, rt); })) return rc;
  if (int rc = stage(world, [&] { make_comm_for(s.base, world, rt); })) return rc;
  if (int rc = stage(world, [&] { finalize_settings(s, rt.backend->name() == "cpu"); })) return rc;
  Context cx{&s, rt.backend.get(), world, mpi.rank(), mpi.size(), rt.backend->name(), rt.comm->name(), rt.node};
  try {
    Report r;
    r.machine = describe_machine(cx, rt.comm->describe());
    r.settings = settings_text(s);
    rt.comm.reset();  // every measurement makes its own communicator on its subset
    log::info("bench-scaling: " + std::to_string(mpi.size()) + " rank(s), backend " + cx.backend_name +
              ", report to " + s.out_dir);
    Table scaling = s.section("scaling") ? measure_scaling(cx) : Table{"scaling", "(not run)", {}, {}, {}};
    Table allreduce = s.section("allreduce") ? measure_allreduce(cx) : Table{"allreduce", "(not run)", {}, {}, {}};
    Table buckets = s.section("buckets") ? measure_buckets(cx) : Table{"buckets", "(not run)", {}, {}, {}};
    GridResult grid = measure_grid(cx, r.notes);
    const auto fits = fit_allreduce(allreduce);
    Table predict = predict_scaling(s, scaling, fits);
    r.tables = {scaling, allreduce, alpha_beta_table(fits), predict, buckets, grid.grid, critical_batch_table(grid.grid),
                grid.steps, time_to_target_table(s, grid, fits), grid.check};
    // A section not run leaves no table behind (nor do the models fed only by it).
    auto dropped = [&](const Table& t) {
      return t.cols.empty() || (t.name == "alpha_beta" && !s.section("allreduce")) ||
             (t.name == "predict" && !(s.section("scaling") && s.section("allreduce")));
    };
    r.tables.erase(std::remove_if(r.tables.begin(), r.tables.end(), dropped), r.tables.end());
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.machine.facts.push_back({"load average at end", load_average()});
    r.findings = findings(r);
    if (mpi.rank() == 0) {
      for (const Table& t : r.tables) std::printf("\n%s", format_table(t).c_str());
      std::printf("\n# Findings\n");
      for (const std::string& f : r.findings) std::printf("#   %s\n", f.c_str());
      for (const std::string& f : write_report(s, r)) std::printf("wrote %s\n", f.c_str());
      std::fflush(stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    return fail_run(e, world);
  }
}
