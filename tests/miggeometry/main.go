// Command miggeometry prints the MIG tables of go-nvml's mock GPUs (pkg/nvml/mock/gpus) as JSON:
// per GPU model its product label, memory and slices, and per GPU-instance profile the name
// mig-parted would give it, its slices, memory, instance count and placements.
//
// It reports what go-nvml says and nothing else: the corrections from NVIDIA's MIG User Guide
// live in the operator's package data (core/hardware/migtables.json), and a test compares the two, so a
// go-nvml bump that changes a table shows up as a diff instead of silently changing geometry.
package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
)

// goNvmlVersion is the module version in go.mod; the export names it so the committed data
// can say which go-nvml it came from.
const goNvmlVersion = "v0.13.4-1"

type placement struct {
	Start uint32 `json:"start"`
	Size  uint32 `json:"size"`
}

type profile struct {
	GiProfileID   int         `json:"giProfileId"`
	Name          string      `json:"name"`
	ComputeSlices uint32      `json:"computeSlices"`
	MemorySlices  uint32      `json:"memorySlices"`
	MemoryMiB     uint64      `json:"memoryMiB"`
	Instances     uint32      `json:"instances"`
	Placements    []placement `json:"placements"`
}

type model struct {
	NvmlName      string    `json:"nvmlName"`
	MemoryMiB     uint64    `json:"memoryMiB"`
	ComputeSlices uint32    `json:"computeSlices"`
	MemorySlices  uint32    `json:"memorySlices"`
	Profiles      []profile `json:"profiles"`
}

type export struct {
	GoNvml string           `json:"goNvml"`
	Models map[string]model `json:"models"`
}

// The package has no registry of its configs: these are all of its exported GPU variants.
var configs = []gpus.Config{
	gpus.A100_PCIE_40GB,
	gpus.A100_PCIE_80GB,
	gpus.A100_SXM4_40GB,
	gpus.A100_SXM4_80GB,
	gpus.A30_PCIE_24GB,
	gpus.H100_SXM5_80GB,
	gpus.H200_SXM5_141GB,
	gpus.B200_SXM5_180GB,
}

// product is GPU Feature Discovery's nvidia.com/gpu.product value for a full GPU: NVML's device
// name with every space turned into '-' (k8s-device-plugin internal/lm/resource.go).
func product(name string) string {
	return strings.ReplaceAll(name, " ", "-")
}

// memoryGB is mig-parted's rule for the "<n>gb" of a profile name (pkg/types): the profile's
// share of the device memory rounded up to eighths, times the device memory in whole GiB
// (rounded up), rounded to the nearest integer.
func memoryGB(deviceBytes, profileMiB uint64) uint64 {
	const mib = 1 << 20
	const gib = 1 << 30
	share := float64(profileMiB*mib) / float64(deviceBytes)
	share = math.Ceil(share*8) / 8
	deviceGB := float64((deviceBytes + gib - 1) / gib)
	return uint64(math.Round(share * deviceGB))
}

// name is mig-parted's spelling of a GPU instance profile with one compute instance spanning
// it ("<g>g.<gb>gb"), with "+me" for the one profile pkg/types marks as carrying the media
// extensions (GPU_INSTANCE_PROFILE_1_SLICE_REV1).
func name(id int, info nvml.GpuInstanceProfileInfo, deviceBytes uint64) string {
	n := fmt.Sprintf("%dg.%dgb", info.SliceCount, memoryGB(deviceBytes, info.MemorySizeMB))
	if id == nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1 {
		n += "+me"
	}
	return n
}

func exportModel(c gpus.Config) (model, error) {
	deviceBytes := c.MemoryMB << 20
	m := model{NvmlName: c.Name, MemoryMiB: c.MemoryMB}
	ids := make([]int, 0, len(c.MIGProfiles.GpuInstanceProfiles))
	for id := range c.MIGProfiles.GpuInstanceProfiles {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		info := c.MIGProfiles.GpuInstanceProfiles[id]
		p := profile{
			GiProfileID:   id,
			Name:          name(id, info, deviceBytes),
			ComputeSlices: info.SliceCount,
			MemoryMiB:     info.MemorySizeMB,
			Instances:     info.InstanceCount,
			Placements:    []placement{},
		}
		for _, pl := range c.MIGProfiles.GpuInstancePlacements[id] {
			if p.MemorySlices != 0 && pl.Size != p.MemorySlices {
				return m, fmt.Errorf("%s profile %d: placements of sizes %d and %d", c.Name, id, p.MemorySlices, pl.Size)
			}
			p.MemorySlices = pl.Size
			p.Placements = append(p.Placements, placement{Start: pl.Start, Size: pl.Size})
			m.MemorySlices = max(m.MemorySlices, pl.Start+pl.Size)
		}
		if len(p.Placements) == 0 {
			return m, fmt.Errorf("%s profile %d has no placements", c.Name, id)
		}
		m.ComputeSlices = max(m.ComputeSlices, info.SliceCount)
		m.Profiles = append(m.Profiles, p)
	}
	return m, nil
}

func main() {
	out := export{GoNvml: goNvmlVersion, Models: map[string]model{}}
	for _, c := range configs {
		m, err := exportModel(c)
		if err != nil {
			fmt.Fprintln(os.Stderr, "miggeometry:", err)
			os.Exit(1)
		}
		out.Models[product(c.Name)] = m
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "miggeometry:", err)
		os.Exit(1)
	}
}
