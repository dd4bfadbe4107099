"""What the product costs and what it withstands: overhead, flags, load, pricing, scrapes, server,
simulator speed and throughput benchmarks; harness load, tenant watch, Ray affinity and a
replica killed; the abuse list.
"""
