// Command probe is the test workload of make e2e-cluster (the image
// netpol.local/probe:dev, made by make image): a TCP server on the given
// ports that answers each connection with the pod's host name, and a client
// that connects once and prints the answer.
//
//	probe serve 80 81          # listen on every address, ports 80 and 81
//	probe connect 10.0.0.5:80  # exit 0 and print the answer, or exit 1
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		usage()
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2:])
	case "connect":
		timeout := 2 * time.Second
		if len(os.Args) > 3 {
			d, err := time.ParseDuration(os.Args[3])
			if err != nil {
				usage()
			}
			timeout = d
		}
		os.Exit(connect(os.Args[2], timeout))
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: probe serve PORT... | probe connect HOST:PORT [TIMEOUT]")
	os.Exit(2)
}

func serve(ports []string) {
	host, _ := os.Hostname()
	for _, p := range ports {
		l, err := net.Listen("tcp", ":"+p)
		if err != nil {
			fmt.Fprintln(os.Stderr, "probe:", err)
			os.Exit(1)
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					continue
				}
				go func() {
					defer c.Close()
					c.SetDeadline(time.Now().Add(5 * time.Second))
					fmt.Fprintf(c, "%s\n", host)
				}()
			}
		}()
	}
	fmt.Println("probe: serving", ports)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}

func connect(addr string, timeout time.Duration) int {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		return 1
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	b, err := io.ReadAll(c)
	if err != nil && len(b) == 0 {
		fmt.Fprintln(os.Stderr, "probe:", err)
		return 1
	}
	fmt.Print(string(b))
	return 0
}
