// Built once in the image (Dockerfile) so that the standard packages a cell usually imports are
// in the Go build cache that GoNB's first cell in a sandbox starts from (execd/kernels.py).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

var _ = []any{bytes.NewBuffer, json.Marshal, errors.New, io.Copy, maps.Keys[map[int]int], math.Sqrt,
	rand.Int, http.Get, os.Exit, regexp.MustCompile, slices.Sort[[]int], sort.Ints, strconv.Itoa,
	strings.Split, sync.NewCond, time.Now}

func main() { fmt.Println("warm") }
