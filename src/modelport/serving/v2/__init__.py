"""The live server: artifacts answering on the Open Inference Protocol (KServe v2) over HTTP and gRPC.

`codec` turns request bodies into numpy arrays and answers back (JSON, the HTTP binary-data
extension, gRPC raw contents) without per-element objects; `model` is one served model (its
contract check, its runner or Ray replicas, dynamic batching, its timings); `stats` keeps the
statistics extension's counters and the Prometheus histograms in memory every worker shares;
`http` and `grpc` are the two front ends over the same models; `server` runs them in one process;
`workers` runs N such processes on the same ports and replaces one that dies.
"""
