"""The live server: KServe v2 over HTTP and gRPC (`v2/`), a live model repository and its edits,
Ray Serve replicas and the app a Ray Serve bundle runs. Bundles for other servers are
`modelport.packaging`."""
