// A worker for `mpirun -np N mpi_worker DIR` (test_hangs.cpp): joins the job through
// init_process_group, which reads Open MPI's (or PMI's) rank variables, all-reduces rank + 1,
// and writes "rank R of N (launcher): sum S" to DIR/mpi.R.
#include <fstream>
#include <iostream>
#include <string>

#include "comm/init_process_group.h"
#include "tensor/ops.h"

int main(int argc, char** argv) {
  using namespace ddplab;
  if (argc < 2) {
    std::cerr << "usage: mpi_worker DIR" << std::endl;
    return 2;
  }
  try {
    const distributed::LaunchEnv env = distributed::launch_env_from_environment();
    distributed::InitOptions o;
    o.timeout = std::chrono::seconds(30);
    auto pg = distributed::init_process_group(o);
    Tensor t = ops::full({4}, pg->rank() + 1);
    pg->all_reduce(t)->wait();
    std::ofstream(std::string(argv[1]) + "/mpi." + std::to_string(pg->rank()))
        << "rank " << pg->rank() << " of " << pg->size() << " (" << env.launcher << "): sum "
        << t.to_vector<float>()[0] << "\n";
    pg->barrier()->wait();  // rank 0 hosts the store: nobody leaves before everyone is done
  } catch (const std::exception& e) {
    std::cerr << "mpi_worker: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
