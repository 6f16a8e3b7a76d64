"""The source controller (target side): Sources and ClusterSources as service accounts and RBAC."""
