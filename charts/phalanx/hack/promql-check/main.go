// Parses PromQL expressions (one JSON string array on stdin) with Prometheus's own parser.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	var exprs []string
	if err := json.NewDecoder(os.Stdin).Decode(&exprs); err != nil {
		fmt.Println("decode:", err)
		os.Exit(2)
	}
	failed := 0
	for _, e := range exprs {
		if _, err := parser.NewParser(parser.Options{}).ParseExpr(e); err != nil {
			failed++
			fmt.Printf("FAIL %q: %v\n", e, err)
		}
	}
	fmt.Printf("%d expressions, %d failed\n", len(exprs), failed)
	if failed > 0 {
		os.Exit(1)
	}
}
