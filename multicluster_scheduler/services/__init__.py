"""Services that select proxy pods are rerouted to delegates; global services are copied to
targets."""
