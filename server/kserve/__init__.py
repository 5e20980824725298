"""KServe v2 pieces shared by the HTTP routes and the gRPC service: config, statistics, infer."""
