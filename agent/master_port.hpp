#pragma once
// Holding a job's master port from Prepare until rank 0 starts: bound and listening on
// the advertised address, so no other process (another job, a stray server) can take it
// meanwhile, and a port already taken is found before any rank starts.

#include <string>

#include "common/core/error.hpp"

namespace corral::agent {

// The listening socket's fd; the caller closes it just before rank 0 starts (rank 0
// binds the port itself). Conflict when someone already holds the port (listening on it,
// or an outgoing connection bound to it); InvalidArgument when `address` is not an IP
// address; Internal for any other failure. Connections in TIME_WAIT on the port do not
// make it busy (SO_REUSEADDR, as PyTorch's TCPStore and tcp-check bind it).
Result<int> hold_master_port(const std::string& address, int port);

}  // namespace corral::agent
