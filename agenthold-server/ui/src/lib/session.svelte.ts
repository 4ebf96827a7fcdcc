// The signed-in user (`GET /api/v1/me`), loaded once at start and after changes to workspaces.
import { api, ok, type Schemas } from './api/client';

class Session {
  me = $state<Schemas['Me'] | null>(null);
  loading = $state(true);
  /** Whether a load was started (not reactive: only read to start the first one). */
  started = false;

  async load(): Promise<void> {
    this.started = true;
    try {
      this.me = await ok(api.GET('/api/v1/me'));
    } catch {
      this.me = null;
    } finally {
      this.loading = false;
    }
  }

  /** The caller's role in workspace `ws`, from /me. */
  roleIn(ws: string): string | null {
    return this.me?.workspaces.find((w) => w.id === ws)?.role ?? null;
  }
}

export const session = new Session();

/** Whether a workspace role may administer (members, secrets, every agent). */
export const isWsAdmin = (role: string | null | undefined): boolean => role === 'owner' || role === 'admin';
/** Whether an agent role may operate (exec, terminal, files write, start/stop). */
export const canOperate = (role: string | null | undefined): boolean => role === 'admin' || role === 'operator';
