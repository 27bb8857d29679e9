package report

import (
	"bytes"
	"context"
	"flag"
	"image"
	"image/color"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var updateScreenshot = flag.Bool("update-screenshot", false, "write docs/conformance-report.png from the sample report")

// chromium finds Debian's chromium. Without it the test fails, with what to
// do, unless NETPOL_SKIP_BROWSER=1: the rendered page is part of the proof.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("NETPOL_SKIP_BROWSER") == "1" {
		t.Skip("chromium is not installed and NETPOL_SKIP_BROWSER=1")
	}
	t.Fatal("chromium is not installed: this test renders index.html in headless Chromium " +
		"(install it with `apt-get install -y chromium`, as .ci/run does; set NETPOL_SKIP_BROWSER=1 to skip)")
	return ""
}

// runChromium runs headless chromium with its own profile and cache in a
// temporary directory, bounded in time.
func runChromium(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	profile := t.TempDir()
	base := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--no-default-browser-check", "--disable-extensions",
		"--hide-scrollbars", "--force-device-scale-factor=1",
		"--user-data-dir=" + profile,
	}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+profile, "XDG_CONFIG_HOME="+profile, "XDG_CACHE_HOME="+profile)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes()
}

// TestBrowserRendersReport renders index.html in headless Chromium: the
// rendered DOM shows the summary and a mismatch's explain text and trace,
// and the screenshot is a real page with the matrices' green and red.
func TestBrowserRendersReport(t *testing.T) {
	bin := chromium(t)
	r := screenshotReport()
	dir := writeSample(t, r)
	index := filepath.Join(dir, HTMLFile)
	url := "file://" + index

	dom := string(runChromium(t, bin, "--dump-dom", url))
	for _, want := range []string{
		`id="summary"`,
		"<b>5</b><span>cases</span> · 4 passed, 1 failed",
		"<b>2</b><span>mismatches</span>",
		"<b>lab</b><span>runner</span>",
		"SCTP not probed: the kernel has no sctp module",
		`AdminNetworkPolicy deny-x-to-y-a ingress[0] "deny-x", action Deny`,
		"netpol/in.5f0c2a91d3e4: drop   -&gt; drop   &lt;script&gt;",
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the rendered DOM lacks %s", want)
		}
	}
	if strings.Contains(dom, "<script") {
		t.Error("the rendered DOM has a script element")
	}

	shot := filepath.Join(t.TempDir(), "report.png")
	runChromium(t, bin, "--screenshot="+shot, "--window-size=1280,2000", url)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1280 || b.Dy() != 2000 {
		t.Errorf("screenshot is %v, want 1280x2000", b)
	}
	stats := pixels(img)
	t.Logf("screenshot: %d colours, %d green-ish, %d red-ish, %d yellow-ish pixels", stats.colours, stats.green, stats.red, stats.yellow)
	if stats.colours < 50 || stats.green < 5000 || stats.red < 1000 || stats.yellow < 100 {
		t.Errorf("the screenshot looks blank or unstyled: %+v", stats)
	}
	if *updateScreenshot {
		b, err := os.ReadFile(shot)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join("..", "..", "docs", "conformance-report.png"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type pixelStats struct{ colours, green, red, yellow int }

// pixels counts the distinct colours and the pixels of the report's
// allowed green, denied red and mismatch yellow.
func pixels(img image.Image) pixelStats {
	var s pixelStats
	seen := map[color.RGBA]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			c := color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(bl >> 8), 255}
			seen[c] = true
			switch {
			case c.G > 110 && c.R < 80 && c.B < 110:
				s.green++
			case c.R > 160 && c.G < 90 && c.B < 90:
				s.red++
			case c.R > 220 && c.G > 180 && c.B < 60:
				s.yellow++
			}
		}
	}
	s.colours = len(seen)
	return s
}
