# CPU spin on every core, forever: only the sandbox's timeout can end it ($1 is the marker).
marker="$1"
for _ in $(seq "$(nproc)"); do
    sh -c 'while :; do :; done' "spinner-$marker" &
done
echo "spinning: note $(nproc) busy loops"
wait
