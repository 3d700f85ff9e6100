// Command neuron-dra-sim is a DRA kubelet plugin for the rig's real node: it publishes the node's simulated
// Neuron devices under the Neuron DRA driver's name, exactly as the rig describes them (a JSON list of
// resource.k8s.io/v1 Devices), and prepares the claims the kubelet hands it before their containers start.
//
// Preparing a claim hands its devices to the container as the Neuron driver does, through a CDI spec that
// containerd applies: the device nodes (/dev/neuron<id>), the NeuronCores the runtime may reserve
// (NEURON_RT_VISIBLE_CORES, logical cores at the claim's setting) and that setting itself
// (NEURON_LOGICAL_NC_CONFIG, from the claim's NeuronConfig). Each prepare and unprepare is written to stdout
// as one JSON line, which the rig's process log keeps for the tests.
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	cdi "tags.cncf.io/container-device-interface/specs-go"
)

const (
	// The opaque config a claim sets its logical-NeuronCore setting with (neuronfleet.contract.dra).
	configAPIVersion = "neuron.aws.com/v1"
	configKind       = "NeuronConfig"
	// The device attribute holding a device's index on its node.
	deviceIDAttribute = "deviceId"
	// The oldest CDI spec version with everything used here: containerd 2.x reads it.
	cdiVersion = "0.5.0"
)

// record is one line of the plugin's log: what the kubelet asked of it.
type record struct {
	Event     string    `json:"event"`
	Namespace string    `json:"namespace"`
	Claim     string    `json:"claim"`
	UID       types.UID `json:"uid"`
	Devices   []string  `json:"devices,omitempty"`
	// What the container is handed: NEURON_RT_VISIBLE_CORES and the LNC (prepare only).
	VisibleCores string `json:"visibleCores,omitempty"`
	LNC          int    `json:"lnc,omitempty"`
}

// neuronConfig is the claim's opaque configuration of the driver's devices.
type neuronConfig struct {
	APIVersion        string `json:"apiVersion"`
	Kind              string `json:"kind"`
	LogicalNeuronCore int    `json:"logicalNeuronCore"`
}

type plugin struct {
	driver string
	// Physical NeuronCores per device, and the LNC a claim without a NeuronConfig gets.
	coresPerDevice, defaultLNC int
	// Where the CDI specs are written (containerd's cdi_spec_dirs), and the host's device nodes.
	cdiDir, deviceNodeDir string
	// Each published device's index (its deviceId attribute), by name.
	deviceIDs map[string]int
	mu        sync.Mutex
	out       *json.Encoder
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
		result, err := p.prepare(claim)
		if err != nil {
			result = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)}
		}
		results[claim.UID] = result
	}
	return results, nil
}

// prepare writes the claim's CDI spec and names its one CDI device on each of the claim's devices.
func (p *plugin) prepare(claim *resourceapi.ResourceClaim) (kubeletplugin.PrepareResult, error) {
	if claim.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{}, errors.New("the claim is not allocated")
	}
	lnc, err := p.logicalNeuronCore(claim.Status.Allocation.Devices.Config)
	if err != nil {
		return kubeletplugin.PrepareResult{}, err
	}
	cdiID := cdiKind(p.driver) + "=" + string(claim.UID)
	var devices []kubeletplugin.Device
	var names []string
	var ids []int
	for _, result := range claim.Status.Allocation.Devices.Results {
		if result.Driver != p.driver {
			continue
		}
		id, known := p.deviceIDs[result.Device]
		if !known {
			return kubeletplugin.PrepareResult{}, fmt.Errorf("device %s is not one this plugin published", result.Device)
		}
		devices = append(devices, kubeletplugin.Device{
			Requests: []string{result.Request}, PoolName: result.Pool, DeviceName: result.Device,
			CDIDeviceIDs: []string{cdiID},
		})
		names = append(names, result.Device)
		ids = append(ids, id)
	}
	visible := visibleCores(ids, p.coresPerDevice/lnc)
	if err := p.writeSpec(claim.UID, ids, visible, lnc); err != nil {
		return kubeletplugin.PrepareResult{}, err
	}
	p.write(record{"prepare", claim.Namespace, claim.Name, claim.UID, names, visible, lnc})
	return kubeletplugin.PrepareResult{Devices: devices}, nil
}

// logicalNeuronCore is the LNC the claim's NeuronConfig sets for this driver, or the default without one.
func (p *plugin) logicalNeuronCore(configs []resourceapi.DeviceAllocationConfiguration) (int, error) {
	lnc := p.defaultLNC
	for _, config := range configs {
		if config.Opaque == nil || config.Opaque.Driver != p.driver {
			continue
		}
		var parsed neuronConfig
		if err := json.Unmarshal(config.Opaque.Parameters.Raw, &parsed); err != nil {
			return 0, fmt.Errorf("the driver's config: %w", err)
		}
		if parsed.APIVersion != configAPIVersion || parsed.Kind != configKind {
			return 0, fmt.Errorf("the driver's config is a %s %s, not a %s %s",
				parsed.APIVersion, parsed.Kind, configAPIVersion, configKind)
		}
		lnc = parsed.LogicalNeuronCore
	}
	if lnc < 1 || p.coresPerDevice%lnc != 0 {
		return 0, fmt.Errorf("logicalNeuronCore %d does not divide a device's %d NeuronCores", lnc, p.coresPerDevice)
	}
	return lnc, nil
}

// visibleCores is the Neuron runtime's NEURON_RT_VISIBLE_CORES for devices ids: the logical cores they hold
// (perDevice each, numbered across the node), as ranges ("0-3,8-11").
func visibleCores(ids []int, perDevice int) string {
	ids = slices.Sorted(slices.Values(ids))
	var ranges []string
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		ranges = append(ranges, fmt.Sprintf("%d-%d", ids[i]*perDevice, (ids[j]+1)*perDevice-1))
		i = j + 1
	}
	return strings.Join(ranges, ",")
}

// cdiKind is the CDI kind of the driver's claims: one CDI device per prepared claim, named by its UID.
func cdiKind(driver string) string { return driver + "/claim" }

func (p *plugin) specPath(uid types.UID) string {
	return filepath.Join(p.cdiDir, p.driver+"-"+string(uid)+".json")
}

// writeSpec writes the claim's CDI spec, whole or not at all (containerd may read the directory at any time).
func (p *plugin) writeSpec(uid types.UID, ids []int, visible string, lnc int) error {
	edits := cdi.ContainerEdits{Env: []string{
		"NEURON_RT_VISIBLE_CORES=" + visible,
		"NEURON_LOGICAL_NC_CONFIG=" + strconv.Itoa(lnc),
	}}
	for _, id := range ids {
		name := "neuron" + strconv.Itoa(id)
		edits.DeviceNodes = append(edits.DeviceNodes, &cdi.DeviceNode{
			Path: "/dev/" + name, HostPath: filepath.Join(p.deviceNodeDir, name),
		})
	}
	spec := cdi.Spec{
		Version: cdiVersion,
		Kind:    cdiKind(p.driver),
		Devices: []cdi.Device{{Name: string(uid), ContainerEdits: edits}},
	}
	text, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	staging, err := os.CreateTemp(p.cdiDir, ".spec-*")
	if err != nil {
		return err
	}
	defer os.Remove(staging.Name())
	if _, err := staging.Write(text); err != nil {
		staging.Close()
		return err
	}
	if err := staging.Close(); err != nil {
		return err
	}
	return os.Rename(staging.Name(), p.specPath(uid))
}

func (p *plugin) UnprepareResourceClaims(
	_ context.Context, claims []kubeletplugin.NamespacedObject,
) (map[types.UID]error, error) {
	results := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		err := os.Remove(p.specPath(claim.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil // never prepared here, or unprepared already
		}
		p.write(record{"unprepare", claim.Namespace, claim.Name, claim.UID, nil, "", 0})
		results[claim.UID] = err
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
	coresPerDevice := flag.Int("cores-per-device", 0, "physical NeuronCores per device")
	defaultLNC := flag.Int("default-lnc", 1, "the logical-NeuronCore setting of a claim without a NeuronConfig")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "where CDI specs are written (containerd's cdi_spec_dirs)")
	deviceNodeDir := flag.String("device-node-dir", "/dev", "the host's directory of neuron<id> device nodes")
	flag.Parse()
	if *kubeconfig == "" || *node == "" || *devicesFile == "" || *coresPerDevice < 1 {
		return errors.New("--kubeconfig, --node-name, --devices and --cores-per-device are required")
	}
	text, err := os.ReadFile(*devicesFile)
	if err != nil {
		return err
	}
	var devices []resourceapi.Device
	if err := json.Unmarshal(text, &devices); err != nil {
		return fmt.Errorf("%s: %w", *devicesFile, err)
	}
	ids, err := deviceIDs(devices)
	if err != nil {
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
	for _, dir := range []string{registrar, data, *cdiDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	handler := &plugin{
		driver: *driver, coresPerDevice: *coresPerDevice, defaultLNC: *defaultLNC,
		cdiDir: *cdiDir, deviceNodeDir: *deviceNodeDir, deviceIDs: ids, out: json.NewEncoder(os.Stdout),
	}
	helper, err := kubeletplugin.Start(ctx, handler,
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

// deviceIDs maps each device's name to its deviceId attribute.
func deviceIDs(devices []resourceapi.Device) (map[string]int, error) {
	ids := make(map[string]int, len(devices))
	for _, device := range devices {
		id := device.Attributes[deviceIDAttribute].IntValue
		if id == nil {
			return nil, fmt.Errorf("device %s has no int attribute %s", device.Name, deviceIDAttribute)
		}
		ids[device.Name] = int(*id)
	}
	return ids, nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "neuron-dra-sim: %v\n", err)
		os.Exit(1)
	}
}
