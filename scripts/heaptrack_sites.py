#!/usr/bin/env python3
# Compares two heaptrack runs site by site: each run's flame-graph export (cost type "peak":
# bytes held at the run's highest total) summed by the innermost bourse frame of each stack,
# sorted by growth from the first run to the second (docs/results/memory.md, session 12).
# Usage: heaptrack_print -f RUN.zst -p 0 -a 0 -T 0 -F RUN.txt --flamegraph-cost-type peak
#        python3 scripts/heaptrack_sites.py SHORT.txt LONG.txt [ROWS]
import re, sys
def load(path):
    out = {}
    for l in open(path, errors='replace'):
        l = l.rstrip('\n')
        stack, _, n = l.rpartition(' ')
        try: n = int(n)
        except ValueError: continue
        frames = stack.split(';')
        key = None
        for f in reversed(frames):
            if 'bourse' in f:
                key = f; break
        if key is None: key = '(no bourse frame) ' + (frames[-1] if frames else '?')
        key = re.sub(r'<[^<>]*>', '', re.sub(r'<[^<>]*>', '', re.sub(r'<[^<>]*>', '', key)))
        key = re.sub(r'::h[0-9a-f]{16}', '', key)
        out[key] = out.get(key, 0) + n
    return out
a = load(sys.argv[1]); b = load(sys.argv[2])
print(f"total {sum(a.values())/2**20:.1f} -> {sum(b.values())/2**20:.1f} MiB")
keys = sorted(set(a)|set(b), key=lambda k: -(b.get(k,0)-a.get(k,0)))
n = int(sys.argv[3]) if len(sys.argv) > 3 else 30
for k in keys[:n] + ['...'] + keys[-8:]:
    if k == '...': print('... shrinking'); continue
    print(f"{a.get(k,0)/2**20:8.2f} {b.get(k,0)/2**20:8.2f} {(b.get(k,0)-a.get(k,0))/2**20:+8.2f}  {k[:150]}")
