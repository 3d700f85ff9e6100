// Command neuron-dra-sim is a DRA kubelet plugin for the rig's real node: it publishes the node's simulated
// Neuron devices under the Neuron DRA driver's name, exactly as the rig describes them (a JSON list of
// resource.k8s.io/v1 Devices), and prepares the claims the kubelet hands it before their containers start.
//
// Preparing a claim names no CDI device (a simulated device has nothing to inject); each prepare and
// unprepare is written to stdout as one JSON line, which the rig's process log keeps for the tests.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// record is one line of the plugin's log: what the kubelet asked of it.
type record struct {
	Event     string    `json:"event"`
	Namespace string    `json:"namespace"`
	Claim     string    `json:"claim"`
	UID       types.UID `json:"uid"`
	Devices   []string  `json:"devices,omitempty"`
}

type plugin struct {
	driver string
	mu     sync.Mutex
	out    *json.Encoder
}

func (p *plugin) write(r record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.out.Encode(r); err != nil {
		fmt.Fprintf(os.Stderr, "neuron-dra-sim: writing the log: %v\n", err)
	}
}

func (p *plugin) PrepareResourceClaims(
	_ context.Context, claims []*resourceapi.ResourceClaim,
) (map[types.UID]kubeletplugin.PrepareResult, error) {
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		if claim.Status.Allocation == nil {
			results[claim.UID] = kubeletplugin.PrepareResult{Err: errors.New("the claim is not allocated")}
			continue
		}
		var devices []kubeletplugin.Device
		var names []string
		for _, result := range claim.Status.Allocation.Devices.Results {
			if result.Driver != p.driver {
				continue
			}
			devices = append(devices, kubeletplugin.Device{
				Requests: []string{result.Request}, PoolName: result.Pool, DeviceName: result.Device,
			})
			names = append(names, result.Device)
		}
		p.write(record{"prepare", claim.Namespace, claim.Name, claim.UID, names})
		results[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
	}
	return results, nil
}

func (p *plugin) UnprepareResourceClaims(
	_ context.Context, claims []kubeletplugin.NamespacedObject,
) (map[types.UID]error, error) {
	results := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		p.write(record{"unprepare", claim.Namespace, claim.Name, claim.UID, nil})
		results[claim.UID] = nil
	}
	return results, nil
}

func (p *plugin) HandleError(_ context.Context, err error, msg string) {
	fmt.Fprintf(os.Stderr, "neuron-dra-sim: %s: %v\n", msg, err)
}

// WatchHealthStatus is never called: the health service is off (see run).
func (p *plugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func run() error {
	kubeconfig := flag.String("kubeconfig", "", "the node's kubeconfig")
	node := flag.String("node-name", "", "the node whose devices these are")
	driver := flag.String("driver-name", "neuron.aws.com", "the DRA driver's name")
	kubeletRoot := flag.String("kubelet-root-dir", "/var/lib/kubelet", "the kubelet's --root-dir")
	devicesFile := flag.String("devices", "", "a JSON list of resource.k8s.io/v1 Devices to publish")
	flag.Parse()
	if *kubeconfig == "" || *node == "" || *devicesFile == "" {
		return errors.New("--kubeconfig, --node-name and --devices are required")
	}
	text, err := os.ReadFile(*devicesFile)
	if err != nil {
		return err
	}
	var devices []resourceapi.Device
	if err := json.Unmarshal(text, &devices); err != nil {
		return fmt.Errorf("%s: %w", *devicesFile, err)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	registrar := filepath.Join(*kubeletRoot, "plugins_registry")
	data := filepath.Join(*kubeletRoot, "plugins", *driver)
	for _, dir := range []string{registrar, data} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	helper, err := kubeletplugin.Start(ctx, &plugin{driver: *driver, out: json.NewEncoder(os.Stdout)},
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(*node),
		kubeletplugin.DriverName(*driver),
		kubeletplugin.RegistrarDirectoryPath(registrar),
		kubeletplugin.PluginDataDirectoryPath(data),
		// No health to report for a simulated device: the kubelet is told so at registration.
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return err
	}
	defer helper.Stop()
	pool := resourceslice.Pool{Slices: []resourceslice.Slice{{Devices: devices}}}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{*node: pool}}); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "neuron-dra-sim: %d devices of %s published for node %s\n", len(devices), *driver, *node)
	<-ctx.Done()
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "neuron-dra-sim: %v\n", err)
		os.Exit(1)
	}
}
