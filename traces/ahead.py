import math, random, sys, datetime
# demand shape: requests/s, 2-minute samples
def shape(t, peak_hour=9.0, growth=0.0, holiday=None, seed=7):
    day = t // 86400
    hour = (t % 86400) / 3600.0
    weekday = (3 + day) % 7   # 2024-05-02 is a Thursday: day 0 = Thursday (weekday index Mon=0 -> 3)
    # daily curve: night 200, steep ramp over 1.5h to the peak plateau, a lunch bump, evening decline
    ramp_start = peak_hour - 1.5
    if hour < ramp_start: base = 200
    elif hour < peak_hour: base = 200 + (2200) * ((hour - ramp_start) / 1.5) ** 2
    elif hour < 17: base = 2400 + 300 * math.exp(-((hour - 12.5) ** 2) / 0.5)
    elif hour < 21: base = 2400 - 2200 * (hour - 17) / 4
    else: base = 200
    if weekday >= 5: base = 200 + (base - 200) * 0.35
    if holiday is not None and day == holiday: base = 200 + (base - 200) * 0.3
    base *= (1 + growth) ** (t / 86400.0 / 7)
    return base

def main(out, days=15, step=120, **kw):
    rnd = random.Random(kw.pop('seed', 7))
    start = datetime.datetime(2024, 5, 2, tzinfo=datetime.timezone.utc)
    with open(out, 'w') as f:
        f.write('timestamp,rps\n')
        for i in range(days * 86400 // step):
            t = i * step
            v = shape(t, **kw) * (1 + rnd.gauss(0, 0.04))
            ts = (start + datetime.timedelta(seconds=t)).strftime('%Y-%m-%dT%H:%M:%SZ')
            f.write(f'{ts},{v:.1f}\n')

if __name__ == '__main__':
    variant = sys.argv[2] if len(sys.argv) > 2 else 'shipped'
    kw = {'shipped': {}, 'late-peak': {'peak_hour': 11.0, 'seed': 11}, 'growth': {'growth': 0.15, 'seed': 13},
          'holiday': {'holiday': 14, 'seed': 17}}[variant]
    main(sys.argv[1], **kw)
