"""Services that select proxy pods are rerouted to delegates; global Services, and the Ingresses
that route to them, are copied to targets."""
