// bench-scaling: one launch measures every power-of-two subset of the ranks (weak and strong
// scaling of each gradient-path variant with where the time goes; allreduce, reduce-scatter and
// all-gather alone; bucket sizes), a batch-size / learning-rate grid on Fashion-MNIST with the
// time to a target accuracy on N ranks it predicts and measures, an alpha-beta model, and the
// PyTorch DDP peer; writes a table to stdout and a report folder.
//   mpirun -np 8 ./bench-scaling --config bench/scaling.ini [--out DIR] [--section.key value ...]
//   ./bench-scaling                       (one rank: n = 1 and the grid; report in ./scaling-report)
// Before each section rank 0 writes the report of the sections finished so far; Ctrl-C, SIGTERM
// or SIGUSR1 (a time limit) leaves that report, marked as cut short during the next section.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "dpt/app.hpp"
#include "dpt/check.hpp"
#include "dpt/log.hpp"
#include "dpt/scaling.hpp"

using namespace dpt;
using namespace dpt::scaling;

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
    // Each model's table once (the Trainers the measurements build by the hundred stay quiet).
    if (s.section("scaling") || s.section("buckets"))
      for (const ModelSpec& m : s.models) log::info("model " + m.name + ":\n" + model_plan(m).describe());
    install_cut_short_handlers();
    Table scaling{"scaling", "(not run)", {}, {}, {}}, buckets{"buckets", "(not run)", {}, {}, {}};
    std::vector<Table> collectives;
    GridResult grid{{"grid", "", {}, {}, {}}, {"steps", "", {}, {}, {}}, {"check", "", {}, {}, {}}};
    // A section not run (or not run yet) leaves no table behind (nor do the models fed only by it).
    std::vector<std::string> done;
    auto finished = [&](const std::string& name) {
      return std::find(done.begin(), done.end(), name) != done.end();
    };
    bool grid_measured = false;
    auto dropped = [&](const Table& t) {
      return t.cols.empty() || (t.name == "alpha_beta" && !finished("allreduce")) ||
             (t.name == "predict" && !(finished("scaling") && finished("allreduce"))) ||
             ((t.name == "critical" || t.name == "tta") && !grid_measured);
    };
    auto assemble = [&](const Table& ddp) {
      Table allreduce{"allreduce", "", {}, {}, {}};
      for (const Table& t : collectives)
        if (t.name == "allreduce") allreduce = t;
      const auto fits = fit_allreduce(allreduce);
      const Table predict = predict_scaling(s, scaling, fits);
      const Table critical = critical_batch_table(grid.grid), tta = time_to_target_table(s, grid, fits);
      r.tables = {scaling, ddp};
      r.tables.insert(r.tables.end(), collectives.begin(), collectives.end());
      r.tables.insert(r.tables.end(), {alpha_beta_table(fits), predict, buckets, grid.grid, critical, grid.steps, tta,
                                       grid.check});
      r.tables.erase(std::remove_if(r.tables.begin(), r.tables.end(), dropped), r.tables.end());
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.findings = findings(r);
    };
    const Table peer_not_run{"ddp_peer", "PyTorch DDP peer: not run yet", {}, {}, {}};
    // Before each section, the report of those finished so far: a launch cut short keeps them.
    auto starting = [&](const std::string& section) {
      assemble(peer_not_run);
      if (mpi.rank() == 0) write_partial_report(s, r, section, done);
    };
    if (s.section("scaling")) {
      starting("scaling");
      scaling = measure_scaling(cx);
      done.push_back("scaling");
    }
    if (s.section("allreduce")) {
      starting("allreduce");
      for (Collective c : s.collectives) collectives.push_back(measure_collective(cx, c));
      done.push_back("allreduce");
    }
    if (s.section("buckets")) {
      starting("buckets");
      buckets = measure_buckets(cx);
      done.push_back("buckets");
    }
    if (s.grid && s.section("grid")) starting("grid");
    grid = measure_grid(cx, r.notes);
    grid_measured = true;
    if (s.grid && s.section("grid")) done.push_back("grid");
    // Last: the peer needs the GPUs that dptrain's measurements no longer hold.
    starting("ddp peer");
    std::vector<std::string> peer_notes;
    auto peer_rows = [&](const std::vector<PeerRun>& runs) {
      Table ddp = peer_table(s, scaling, runs);
      ddp.notes.insert(ddp.notes.end(), peer_notes.begin(), peer_notes.end());
      return ddp;
    };
    const std::vector<PeerRun> peer = run_ddp_peer(cx, peer_notes, [&](const std::vector<PeerRun>& runs) {
      assemble(peer_rows(runs));
      write_partial_report(s, r, "ddp peer", done);  // rank 0 only calls this
    });
    r.machine.facts.push_back({"load average at end", load_average()});
    assemble(peer_rows(peer));
    if (mpi.rank() == 0) {
      begin_final_report(s);
      for (const Table& t : r.tables) std::printf("\n%s", format_table(t).c_str());
      std::printf("\n# Findings\n");
      for (const std::string& f : r.findings) std::printf("#   %s\n", f.c_str());
      for (const std::string& f : write_report(s, r)) std::printf("wrote %s\n", f.c_str());
      std::fflush(stdout);
      end_final_report();
    }
    return 0;
  } catch (const std::exception& e) {
    return fail_run(e, world);
  }
}
