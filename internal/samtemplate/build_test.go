package samtemplate_test

import (
	"debug/elf"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestMakeBuildYieldsStaticArm64Bootstrap runs exactly what `sam build` runs for each
// function (make build-<LogicalId> with ARTIFACTS_DIR) and inspects the binary: a static
// linux/arm64 ELF named bootstrap, as provided.al2023 on arm64 executes it.
func TestMakeBuildYieldsStaticArm64Bootstrap(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles three binaries")
	}
	t.Parallel()
	for _, id := range functionIDs {
		t.Run(id, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			cmd := exec.Command("make", "--no-print-directory", "build-"+id, "ARTIFACTS_DIR="+dir)
			cmd.Dir = root(t)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("make build-%s: %v\n%s", id, err, out)
			}
			f, err := elf.Open(filepath.Join(dir, "bootstrap"))
			if err != nil {
				t.Fatalf("bootstrap: %v", err)
			}
			defer f.Close()
			if f.Machine != elf.EM_AARCH64 || f.Class != elf.ELFCLASS64 || f.Type != elf.ET_EXEC {
				t.Errorf("bootstrap is %v %v %v, want a 64-bit arm64 executable", f.Class, f.Machine, f.Type)
			}
			if f.OSABI != elf.ELFOSABI_NONE && f.OSABI != elf.ELFOSABI_LINUX {
				t.Errorf("OS ABI %v", f.OSABI)
			}
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
					t.Errorf("bootstrap has a %v segment: not static (CGO_ENABLED=0 missing?)", p.Type)
				}
			}
			if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
				t.Errorf("bootstrap links %v", libs)
			}
			// -ldflags=-s strips the symbol table; -tags lambda.norpc drops the RPC runtime.
			if syms, _ := f.Symbols(); len(syms) > 0 {
				t.Errorf("bootstrap has %d symbols: not built with -ldflags='-s -w'", len(syms))
			}
		})
	}
}
