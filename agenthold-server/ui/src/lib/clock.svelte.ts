// A shared clock that ticks every 30 s, so relative times stay current.
class Clock {
  value = $state(Date.now());
  constructor() {
    setInterval(() => (this.value = Date.now()), 30_000);
  }
}
export const now = new Clock();
