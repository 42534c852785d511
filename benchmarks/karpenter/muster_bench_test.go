//go:build test_performance

// Added to Karpenter's scheduling test package at build time (go test -overlay, see build.sh):
// BenchmarkSchedulingMix runs benchmarkScheduler's loop on a pod count and mix read from the
// environment, with the same generators, catalogue (fake.InstanceTypes(400)) and scheduler
// setup as BenchmarkScheduling<N>, and reports what benchmarks/karpenter_side_by_side.py
// compares: the pods themselves (MUSTER_KARPENTER_DUMP, so Muster plans the very same ones),
// process CPU time per Solve, the nodes of the first plan and their hourly price
// (each NodeClaim at its cheapest compatible offering, which is what the fake cloud provider
// launches).

package scheduling_test

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"strconv"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"sigs.k8s.io/karpenter/pkg/controllers/provisioning/scheduling"
	"sigs.k8s.io/karpenter/pkg/operator/injection"
	"sigs.k8s.io/karpenter/pkg/operator/options"
	"sigs.k8s.io/karpenter/pkg/test"
)

func musterMixPods(mix string, count int) []*corev1.Pod {
	switch mix {
	case "diverse":
		return makeDiversePods(count)
	case "plain":
		return makeGenericPods(count)
	case "zone-spread":
		return makeTopologySpreadPods(count, corev1.LabelTopologyZone)
	case "hostname-spread":
		return makeTopologySpreadPods(count, corev1.LabelHostname)
	case "zone-affinity":
		return makePodAffinityPods(count, corev1.LabelTopologyZone)
	case "hostname-anti-affinity":
		return makePodAntiAffinityPods(count, corev1.LabelHostname)
	}
	return nil
}

// musterPod is what the Python side maps to a pod set: the pod's labels, requests and the one
// placement constraint each generator gives (kind "" for a generic pod).
type musterPod struct {
	Labels   map[string]string `json:"labels"`
	CPUMilli int64             `json:"cpu_m"`
	Memory   int64             `json:"memory"`
	Kind     string            `json:"kind"`
	Key      string            `json:"key"`
	Selector map[string]string `json:"selector"`
}

func dumpPods(path string, pods []*corev1.Pod) error {
	out := make([]musterPod, 0, len(pods))
	for _, p := range pods {
		req := p.Spec.Containers[0].Resources.Requests
		mp := musterPod{Labels: p.Labels, CPUMilli: req.Cpu().MilliValue(), Memory: req.Memory().Value()}
		if c := p.Spec.TopologySpreadConstraints; len(c) > 0 {
			mp.Kind, mp.Key, mp.Selector = "spread", c[0].TopologyKey, c[0].LabelSelector.MatchLabels
		}
		if a := p.Spec.Affinity; a != nil {
			if a.PodAffinity != nil && len(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
				t := a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0]
				mp.Kind, mp.Key, mp.Selector = "affinity", t.TopologyKey, t.LabelSelector.MatchLabels
			}
			if a.PodAntiAffinity != nil && len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
				t := a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0]
				mp.Kind, mp.Key, mp.Selector = "anti-affinity", t.TopologyKey, t.LabelSelector.MatchLabels
			}
		}
		out = append(out, mp)
	}
	data, err := json.Marshal(out)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

func cpuNanos() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// mixPods holds the pods across the benchmark's calls (testing calls it again with a larger
// b.N): one set per process, the set that was dumped.
var mixPods []*corev1.Pod

func BenchmarkSchedulingMix(b *testing.B) {
	count, err := strconv.Atoi(os.Getenv("MUSTER_KARPENTER_PODS"))
	if err != nil || count <= 0 {
		b.Fatalf("MUSTER_KARPENTER_PODS must be a positive pod count")
	}
	mix := os.Getenv("MUSTER_KARPENTER_MIX")
	if mixPods == nil {
		mixPods = musterMixPods(mix, count)
		if mixPods == nil {
			b.Fatalf("unknown MUSTER_KARPENTER_MIX %q", mix)
		}
		if path := os.Getenv("MUSTER_KARPENTER_DUMP"); path != "" {
			if err := dumpPods(path, mixPods); err != nil {
				b.Fatalf("writing the pods to %s: %s", path, err)
			}
		}
	}
	pods := mixPods
	ctx = options.ToContext(injection.WithControllerName(context.Background(), "provisioner"), test.Options())
	scheduler, err := setupScheduler(ctx, pods, scheduling.NumConcurrentReconciles(5))
	if err != nil {
		b.Fatalf("creating scheduler, %s", err)
	}
	b.ResetTimer()
	nodes, cost := 0, 0.0
	cpuStart := cpuNanos()
	for i := 0; i < b.N; i++ {
		results, err := scheduler.Solve(ctx, pods)
		if err != nil {
			b.Fatalf("expected scheduler to schedule all pods without error, got %s", err)
		}
		if len(results.PodErrors) > 0 {
			b.Fatalf("expected all pods to schedule, got %d pods that didn't", len(results.PodErrors))
		}
		if i == 0 {
			nodes = len(results.NewNodeClaims)
			for _, n := range results.NewNodeClaims {
				best := math.Inf(1)
				for _, it := range n.InstanceTypeOptions {
					ofs := it.Offerings.Available().Compatible(n.Requirements)
					if len(ofs) > 0 && ofs.Cheapest().Price < best {
						best = ofs.Cheapest().Price
					}
				}
				cost += best
			}
		}
	}
	cpu := cpuNanos() - cpuStart
	b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(nodes), "nodes")
	b.ReportMetric(cost, "usd/h")
}
