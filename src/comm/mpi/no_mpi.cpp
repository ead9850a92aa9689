// A build without MPI: every run is this process alone.
#include "lockstep/comm.hpp"

namespace lockstep {

std::shared_ptr<ProcessGroup> make_mpi_processes() { return nullptr; }
std::string mpi_library() { return {}; }

}  // namespace lockstep
