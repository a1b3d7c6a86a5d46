#!/usr/bin/env bash
# every 10 s, one 1-token greedy chat to the engine bench-startup started (its port from status.json)
st=bench-results/keepwarm-cpu/engine-warmup-on/status.json
until [ -f "$st" ] && grep -q '"base_url"' "$st"; do sleep 1; done
url=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['base_url'])" "$st")
echo "keep-warm on $url" 
while sleep 10; do
  curl -s -o /dev/null -w "%{time_total}\n" "$url/chat/completions" -H 'content-type: application/json' \
    -d '{"model":"demo","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"temperature":0.7,"top_p":0.95}'
done
