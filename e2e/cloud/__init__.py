"""The cloud test tier: Muster's AWS and GCP providers against cloud APIs served over HTTP on
127.0.0.1 (moto's EC2 behind :mod:`e2e.cloud.ec2`, the Compute fake of
``tests/providers/gcp_fake.py``), and a kubelet stand-in (:mod:`e2e.cloud.kubelet`) that
registers each running instance's Node from what that VM has."""
